"""Three publishers in confirm mode, each on its own connection: one waits for every confirm
before the next publish (a few hundred messages a second at best), one publishes in batches
and waits for each batch, one streams with a window. Only the first is synchronous."""

from __future__ import annotations

import pika

from tests.lab.clients import amqp_connection, pika_connection
from tests.lab.expectations import Verdict, expect, forbid_on
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher

NAME = "synchronous_confirms"
SYNCHRONOUS = connection_name(NAME, "sync-publisher")
BATCHED = connection_name(NAME, "batch-publisher")
STREAMING = connection_name(NAME, "async-publisher")
MESSAGES, BATCH, WINDOW = 40, 10, 20


def drive(lab: Lab) -> None:
    queue = lab.queue("ledger", durable=True)
    with lab.recorded():
        _publish_synchronously(queue)
        _publish_in_batches(queue)
        _publish_streaming(queue)


def _publish_synchronously(queue: str) -> None:
    # pika's BlockingChannel in confirm mode returns from basic_publish only once the
    # broker has confirmed the message.
    with pika_connection(SYNCHRONOUS) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(MESSAGES):
            channel.basic_publish("", queue, b"entry %d" % n,
                                  pika.BasicProperties(delivery_mode=2, message_id=f"sync-{n}"))


def _publish_in_batches(queue: str) -> None:
    with amqp_connection(BATCHED) as connection:
        publisher, messages = ConfirmingPublisher(connection), _messages(queue, "batch")
        for start in range(0, MESSAGES, BATCH):  # each batch waits for all its confirms
            publisher.publish_windowed(messages[start:start + BATCH], window=BATCH)


def _publish_streaming(queue: str) -> None:
    with amqp_connection(STREAMING) as connection:
        ConfirmingPublisher(connection).publish_windowed(_messages(queue, "async"), window=WINDOW)


def _messages(queue: str, label: str) -> list[tuple[bytes, str, dict]]:
    return [(b"entry %d" % n, queue, {"message_id": f"{label}-{n}", "persistent": True}) for n in range(MESSAGES)]


def judge(capture, evidence) -> Verdict:
    return Verdict(
        expect=[expect(evidence, "synchronous_confirms", SYNCHRONOUS, channel=1, at_least=30)],
        forbid_on=[forbid_on(evidence, "synchronous_confirms", BATCHED),
                   forbid_on(evidence, "synchronous_confirms", STREAMING)],
        facts={"publishes_per_connection": MESSAGES, "batch_size": BATCH, "async_window": WINDOW},
    )


SCENARIO = Scenario(
    name=NAME,
    description=("Three confirm-mode publishers of 40 persistent messages to a durable queue: pika "
                 "BlockingChannel waiting for each confirm (synchronous), py-amqp in batches of 10 waiting "
                 "for each batch, py-amqp streaming with a window of 20."),
    drive=drive,
    judge=judge,
)
