"""Persistent messages published on a channel in neither confirm nor tx mode: the publisher
asks for durability but never learns whether the broker took the message."""

from __future__ import annotations

import amqp
import pika

from tests.lab.clients import amqp_connection, pika_connection
from tests.lab.expectations import Verdict, expect, forbid_on
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher

NAME = "persistent_without_confirms"
UNCONFIRMED = connection_name(NAME, "plain-publisher")
TRANSIENT = connection_name(NAME, "transient-publisher")
CONFIRMED = connection_name(NAME, "confirmed-publisher")
MESSAGES = 20


def drive(lab: Lab) -> None:
    queue = lab.queue("invoices", durable=True)
    with lab.recorded():
        with pika_connection(UNCONFIRMED) as connection:
            channel = connection.channel()
            for n in range(MESSAGES):
                channel.basic_publish("", queue, b"invoice %d" % n,
                                      pika.BasicProperties(delivery_mode=2, message_id=f"plain-{n}"))
        with amqp_connection(TRANSIENT) as connection:
            channel = connection.channel()
            for n in range(MESSAGES):
                channel.basic_publish(amqp.Message(b"invoice %d" % n, message_id=f"transient-{n}",
                                                   delivery_mode=1), "", queue)
        with amqp_connection(CONFIRMED) as connection:
            ConfirmingPublisher(connection).publish_windowed(
                [(b"invoice %d" % n, queue, {"message_id": f"confirmed-{n}", "persistent": True})
                 for n in range(MESSAGES)], window=MESSAGES)


def judge(capture, evidence) -> Verdict:
    return Verdict(
        expect=[expect(evidence, "unconfirmed_persistent_publish", UNCONFIRMED, channel=1, at_least=MESSAGES)],
        forbid_on=[forbid_on(evidence, "unconfirmed_persistent_publish", TRANSIENT),
                   forbid_on(evidence, "unconfirmed_persistent_publish", CONFIRMED)],
        facts={"publishes_per_connection": MESSAGES},
    )


SCENARIO = Scenario(
    name=NAME,
    description=("pika publishes 20 persistent messages to a durable queue on a plain channel (no confirms, no "
                 "tx); beside it py-amqp publishes 20 transient messages without confirms, and 20 persistent "
                 "ones in confirm mode, neither of which is at fault."),
    drive=drive,
    judge=judge,
)
