"""One channel number opened three times on one connection. Delivery tags, publish numbers and
confirm mode belong to a channel incarnation: each reopening starts them again."""

from __future__ import annotations

import amqp

from tests.lab.clients import amqp_connection
from tests.lab.expectations import Verdict, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher
from tests.lab.scenarios.waiting import drain_amqp_until

NAME = "channel_reuse"
CLIENT = connection_name(NAME, "client")
CHANNEL = 1
FIRST, SECOND, THIRD = 5, 3, 3


def drive(lab: Lab) -> None:
    queue = lab.queue("reused", durable=True)
    with lab.recorded(), amqp_connection(CLIENT) as connection:
        # First: confirm mode, persistent publishes, consumed and acked one by one.
        channel = connection.channel(CHANNEL)
        _publish_confirmed(connection, channel, queue, FIRST, "first")
        for tag in _consume(connection, channel, queue, FIRST):
            channel.basic_ack(tag)
        channel.close()
        # Second: confirm mode again, numbered from 1 again; one multiple=true ack.
        channel = connection.channel(CHANNEL)
        _publish_confirmed(connection, channel, queue, SECOND, "second")
        channel.basic_ack(_consume(connection, channel, queue, SECOND)[-1], multiple=True)
        channel.close()
        # Third: no confirm mode this time (transient publishes), polled with basic.get.
        channel = connection.channel(CHANNEL)
        for n in range(THIRD):
            channel.basic_publish(amqp.Message(b"third %d" % n, message_id=f"third-{n}"), "", queue)
        for _ in range(THIRD):
            channel.basic_ack(channel.basic_get(queue).delivery_tag)
        channel.close()


def _publish_confirmed(connection, channel, queue: str, count: int, label: str) -> None:
    ConfirmingPublisher(connection, channel).publish_windowed(
        [(b"%s %d" % (label.encode(), n), queue, {"message_id": f"{label}-{n}", "persistent": True})
         for n in range(count)], window=count)


def _consume(connection, channel, queue: str, count: int) -> list[int]:
    channel.basic_qos(0, 10, False)
    tags = []
    consumer_tag = channel.basic_consume(queue, callback=lambda message: tags.append(message.delivery_tag))
    drain_amqp_until(connection, lambda: len(tags) == count, 10, f"{count} deliveries")
    channel.basic_cancel(consumer_tag)
    return tags


def judge(capture, evidence) -> Verdict:
    opens = capture.methods("channel.open", from_broker=False, connection_name=CLIENT, channel=CHANNEL)
    require(len(opens) == 3, f"channel {CHANNEL} opened three times, saw {len(opens)}")
    tags_by_life = [[], [], []]
    for frame in capture.methods("basic.deliver", connection_name=CLIENT) + \
            capture.methods("basic.get-ok", connection_name=CLIENT):
        tags_by_life[sum(frame.number > o.number for o in opens) - 1].append(frame.tag)
    require([sorted(tags) for tags in tags_by_life] == [[1, 2, 3, 4, 5], [1, 2, 3], [1, 2, 3]],
            f"delivery tags restarting at 1 in each incarnation, saw {tags_by_life}")
    return Verdict(expect=[], facts={"channel": CHANNEL, "incarnations": 3,
                                     "confirm_mode": [True, True, False]})


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp opens channel 1 three times on one connection: in confirm mode (5 persistent publishes "
                 "confirmed, consumed with prefetch 10, acked singly), in confirm mode again (3 publishes, tags "
                 "and confirms from 1 again, one multiple=true ack), and without confirm mode (3 transient "
                 "publishes read with basic.get and acked). Nothing to flag."),
    drive=drive,
    judge=judge,
)
