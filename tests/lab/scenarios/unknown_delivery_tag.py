"""Settling a delivery tag the channel does not have outstanding: acking a tag twice, acking a
tag never delivered, and acking on another channel than the one the delivery came on. Each
time the broker closes that channel with 406 PRECONDITION_FAILED."""

from __future__ import annotations

import pika

from tests.lab.clients import pika_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.waiting import pump_pika_until

NAME = "unknown_delivery_tag"
CONSUMER = connection_name(NAME, "consumer")
DOUBLE_ACK, NEVER_DELIVERED, RECEIVING, WRONG_CHANNEL = 1, 2, 3, 4
NEVER_DELIVERED_TAG = 42


def drive(lab: Lab) -> None:
    queue = lab.queue("jobs")
    with lab.recorded(), pika_connection(CONSUMER) as connection:
        feeder = connection.channel(channel_number=5)
        for n in range(2):
            feeder.basic_publish("", queue, b"job %d" % n, pika.BasicProperties(message_id=f"job-{n}"))

        double = connection.channel(channel_number=DOUBLE_ACK)
        tag = _get(double, queue)
        double.basic_ack(tag)
        double.basic_ack(tag)
        _wait_closed_by_broker(connection, double)

        never = connection.channel(channel_number=NEVER_DELIVERED)
        never.basic_ack(NEVER_DELIVERED_TAG)
        _wait_closed_by_broker(connection, never)

        receiving = connection.channel(channel_number=RECEIVING)
        wrong = connection.channel(channel_number=WRONG_CHANNEL)
        tag = _get(receiving, queue)
        wrong.basic_ack(tag)
        _wait_closed_by_broker(connection, wrong)
        receiving.basic_ack(tag)  # then settled where it belongs


def _get(channel, queue: str) -> int:
    method, _properties, _body = channel.basic_get(queue, auto_ack=False)
    require(method is not None, f"a message in {queue}")
    return method.delivery_tag


def _wait_closed_by_broker(connection, channel) -> None:
    pump_pika_until(connection, lambda: channel.is_closed, 10, f"the broker closing channel {channel.channel_number}")


def judge(capture, evidence) -> Verdict:
    closes = capture.methods("channel.close", from_broker=True, connection_name=CONSUMER)
    require(sorted(c.channel for c in closes) == [DOUBLE_ACK, NEVER_DELIVERED, WRONG_CHANNEL]
            and all(c.args["reply_code"] == "406" for c in closes),
            f"channels {DOUBLE_ACK}, {NEVER_DELIVERED}, {WRONG_CHANNEL} closed with 406, saw "
            f"{[(c.channel, c.args['reply_code']) for c in closes]}")
    return Verdict(
        expect=[{**expect(evidence, "unknown_delivery_tag", CONSUMER, channel=channel), "case": case}
                for channel, case in ((DOUBLE_ACK, "double ack"), (NEVER_DELIVERED, "never delivered"),
                                      (WRONG_CHANNEL, "ack on another channel"))],
        facts={"broker_close_reply_code": 406, "never_delivered_tag": NEVER_DELIVERED_TAG},
    )


SCENARIO = Scenario(
    name=NAME,
    description=("pika BlockingConnection, basic.get with manual ack: channel 1 acks its tag twice, channel 2 acks "
                 "tag 42 that was never delivered, channel 4 acks a tag delivered on channel 3 (which then acks "
                 "it itself). The broker closes channels 1, 2 and 4 with 406 PRECONDITION_FAILED."),
    drive=drive,
    judge=judge,
)
