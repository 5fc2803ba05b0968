"""Publishers blocked by a broker-wide memory alarm: the broker stops reading from publishing
connections and tells those that announce the connection.blocked capability with
connection.blocked, then connection.unblocked once the alarm clears."""

from __future__ import annotations

import amqp
import pika

from tests.lab import broker
from tests.lab.clients import amqp_connection, pika_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.waiting import drain_amqp_until, pump_pika_until

NAME = "flow_control"
PIKA_PUBLISHER = connection_name(NAME, "pika-publisher")
AMQP_PUBLISHER = connection_name(NAME, "py-amqp-publisher")


def drive(lab: Lab) -> None:
    queue = lab.queue("telemetry")
    blocked = {PIKA_PUBLISHER: [], AMQP_PUBLISHER: []}
    with lab.recorded(), pika_connection(PIKA_PUBLISHER) as pika_publisher, \
            amqp_connection(AMQP_PUBLISHER, on_blocked=lambda *_: blocked[AMQP_PUBLISHER].append("blocked"),
                            on_unblocked=lambda *_: blocked[AMQP_PUBLISHER].append("unblocked")) as amqp_publisher:
        pika_publisher.add_on_connection_blocked_callback(lambda *_: blocked[PIKA_PUBLISHER].append("blocked"))
        pika_publisher.add_on_connection_unblocked_callback(lambda *_: blocked[PIKA_PUBLISHER].append("unblocked"))
        pika_channel, amqp_channel = pika_publisher.channel(), amqp_publisher.channel()

        def publish(label: str) -> None:
            pika_channel.basic_publish("", queue, b"reading", pika.BasicProperties(message_id=f"pika-{label}"))
            amqp_channel.basic_publish(amqp.Message(b"reading", message_id=f"py-amqp-{label}"), "", queue)

        def pump_until(state: str) -> None:
            pump_pika_until(pika_publisher, lambda: state in blocked[PIKA_PUBLISHER], 20, f"pika {state}")
            drain_amqp_until(amqp_publisher, lambda: state in blocked[AMQP_PUBLISHER], 20, f"py-amqp {state}")

        publish("before")
        with broker.memory_alarm():
            publish("during")  # the broker blocks a connection when it publishes under the alarm
            pump_until("blocked")
        pump_until("unblocked")
        publish("after")


def judge(capture, evidence) -> Verdict:
    for name in (PIKA_PUBLISHER, AMQP_PUBLISHER):
        blocked = capture.methods("connection.blocked", from_broker=True, connection_name=name)
        unblocked = capture.methods("connection.unblocked", from_broker=True, connection_name=name)
        require(bool(blocked) and bool(unblocked) and blocked[0].number < unblocked[-1].number,
                f"connection.blocked then connection.unblocked to {name}")
    return Verdict(
        expect=[expect(evidence, "flow_blocked", name, channel=0) for name in (PIKA_PUBLISHER, AMQP_PUBLISHER)],
        facts={"memory_watermark_during_alarm": broker.ALARM_MEMORY_WATERMARK,
               "memory_watermark_restored": broker.NORMAL_MEMORY_WATERMARK},
    )


SCENARIO = Scenario(
    name=NAME,
    description=("A pika and a py-amqp publisher (both announce the connection.blocked capability) publish, "
                 "then publish again under a memory alarm (vm_memory_high_watermark set to 0.000001): the broker "
                 "sends connection.blocked; the watermark goes back to 0.4 and it sends connection.unblocked."),
    drive=drive,
    judge=judge,
)
