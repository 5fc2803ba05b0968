"""Publishers in confirm mode whose connection ends while confirms are outstanding: once cut
at the TCP level by the client (as when its process is killed), once closed by the broker
(an operator's `rabbitmqctl close_connection`). Every publish not confirmed before the end is
lost from the publisher's point of view."""

from __future__ import annotations

import asyncio
import logging
from contextlib import contextmanager

import aio_pika

from tests.lab import broker
from tests.lab.clients import aio_connection, amqp_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher

NAME = "lost_confirms"
TCP_CUT = connection_name(NAME, "tcp-cut")
BROKER_CLOSED = connection_name(NAME, "broker-closed")
# A persistent message is confirmed once every durable queue it reaches has it on disk: to one
# idle queue in about a millisecond, fanned out to 40 queues in about ten. A busy machine can let
# either pass between the last publish and the reset, so the broker is frozen across the two.
FANOUT_QUEUES, CUT_BURST = 40, 30
CONFIRMED_FIRST, STUCK_BURST = 5, 10
# rabbitmqctl takes from one to several seconds, so the broker's close cannot be timed against
# confirms that take milliseconds. Instead the broker is kept from confirming: under a memory
# alarm it stops reading a connection that publishes, so the burst stays unread, unconfirmed,
# until the close. The connection does not announce the connection.blocked capability, so the
# capture shows no flow control, only publishes that never got a confirm.
WITHOUT_BLOCKED_NOTIFICATION = {"authentication_failure_close": True, "basic.nack": True,
                                "consumer_cancel_notify": True, "publisher_confirms": True}
SETTLE_SECONDS = 0.3


def drive(lab: Lab) -> None:
    subscribers = lab.exchange("subscribers", kind="fanout")
    for number in range(FANOUT_QUEUES):
        lab.queue(f"subscriber-{number}", durable=True, bind_to=subscribers)
    orders = lab.queue("orders", durable=True)
    with lab.recorded(), expected_close_not_logged():
        _cut_after_burst(subscribers)
        asyncio.run(_closed_by_broker_while_unconfirmed(orders))


@contextmanager
def expected_close_not_logged():
    """aiormq logs the broker's close with a traceback; here it is the point, not a problem."""
    logger = logging.getLogger("aiormq.connection")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _cut_after_burst(exchange: str) -> None:
    connection = amqp_connection(TCP_CUT)
    publisher = ConfirmingPublisher(connection)

    def burst() -> None:
        for number in range(CUT_BURST):
            publisher.publish(b"order %d" % number, "", exchange=exchange, message_id=f"cut-{number}",
                              persistent=True)

    broker.sent_then_reset(connection.sock, burst)
    connection.collect()


async def _closed_by_broker_while_unconfirmed(queue: str) -> None:
    connection = await aio_connection(BROKER_CLOSED, capabilities=WITHOUT_BLOCKED_NOTIFICATION)
    channel = await connection.channel(publisher_confirms=True)

    def publish(number: int) -> asyncio.Future:
        message = aio_pika.Message(b"order %d" % number, message_id=f"closed-{number}",
                                   delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        return asyncio.ensure_future(channel.default_exchange.publish(message, routing_key=queue))

    await asyncio.gather(*(publish(n) for n in range(CONFIRMED_FIRST)))
    pid = await asyncio.to_thread(broker.connection_pid, BROKER_CLOSED)
    with broker.memory_alarm():
        stuck = [publish(CONFIRMED_FIRST + n) for n in range(STUCK_BURST)]
        await asyncio.sleep(SETTLE_SECONDS)
        require(sum(future.done() for future in stuck) < STUCK_BURST,
                "the broker leaving publishes unconfirmed under the memory alarm")
        await asyncio.to_thread(broker.force_close_connection, pid, "lab: operator closes")
        await asyncio.gather(*stuck, return_exceptions=True)  # the unconfirmed ones fail, as they should


def judge(capture, evidence) -> Verdict:
    forced = capture.methods("connection.close", from_broker=True, connection_name=BROKER_CLOSED)
    require(bool(forced) and forced[0].args["reply_code"] == "320",
            "the broker closing the broker-closed connection with 320 CONNECTION_FORCED")
    require(capture.stream_named(TCP_CUT).ended, "the end of the tcp-cut connection")
    return Verdict(
        expect=[expect(evidence, "lost_confirm", TCP_CUT, channel=1),
                expect(evidence, "lost_confirm", BROKER_CLOSED, channel=1)],
        facts={"publishes": {TCP_CUT: CUT_BURST, BROKER_CLOSED: CONFIRMED_FIRST + STUCK_BURST}},
    )


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp publisher sends a burst of 30 persistent messages in confirm mode to a fanout of 40 "
                 "durable queues and resets its TCP connection at once. aio-pika publisher in confirm mode gets "
                 "5 persistent messages confirmed, then publishes 10 more during a memory alarm (it does not "
                 "announce connection.blocked, so the broker just stops reading) and `rabbitmqctl "
                 "close_connection` closes it (320). Both leave publishes unconfirmed."),
    drive=drive,
    judge=judge,
)
