"""Consuming without a consumer and without acks: basic.get with and without ack, basic.get
on an empty queue, and a fast no_ack consumer (auto-ack: settled on send, so neither unacked
buildup nor an unbounded prefetch; basic.qos does not apply to it)."""

from __future__ import annotations

import asyncio

import pika

from tests.lab.clients import aio_connection, amqp_connection, pika_connection
from tests.lab.expectations import Verdict, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario

NAME = "polling_and_autoack"
PRODUCER = connection_name(NAME, "producer")
POLLER = connection_name(NAME, "poller")
AUTOACK = connection_name(NAME, "autoack-consumer")
GET_WITH_ACK, GET_NO_ACK, FIREHOSE = 3, 2, 60


def drive(lab: Lab) -> None:
    polled, firehose = lab.queue("polled"), lab.queue("firehose")
    with lab.recorded():
        with pika_connection(PRODUCER) as producer:
            channel = producer.channel()
            for n in range(GET_WITH_ACK + GET_NO_ACK):
                channel.basic_publish("", polled, b"report %d" % n, pika.BasicProperties(message_id=f"report-{n}"))
            for n in range(FIREHOSE):
                channel.basic_publish("", firehose, b"tick %d" % n, pika.BasicProperties(message_id=f"tick-{n}"))
        _poll(polled)
        asyncio.run(_consume_without_acks(firehose))


def _poll(queue: str) -> None:
    with amqp_connection(POLLER) as connection:
        channel = connection.channel()
        for _ in range(GET_WITH_ACK):
            message = channel.basic_get(queue, no_ack=False)
            channel.basic_ack(message.delivery_tag)
        for _ in range(GET_NO_ACK):
            require(channel.basic_get(queue, no_ack=True) is not None, f"a message left in {queue}")
        require(channel.basic_get(queue, no_ack=False) is None, f"{queue} empty")


async def _consume_without_acks(queue_name: str) -> None:
    async with await aio_connection(AUTOACK) as connection:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name)
        received = 0
        async with queue.iterator(no_ack=True) as messages:
            async for _message in messages:
                received += 1
                if received == FIREHOSE:
                    return


def judge(capture, evidence) -> Verdict:
    gets = capture.methods("basic.get-ok", connection_name=POLLER)
    require(len(gets) == GET_WITH_ACK + GET_NO_ACK, f"{GET_WITH_ACK + GET_NO_ACK} basic.get-ok")
    require(len(capture.methods("basic.get-empty", connection_name=POLLER)) == 1, "one basic.get-empty")
    consumes = capture.methods("basic.consume", connection_name=AUTOACK)
    require(len(consumes) == 1 and consumes[0].flag("no_ack"), "one no_ack basic.consume")
    require(len(capture.methods("basic.deliver", connection_name=AUTOACK)) == FIREHOSE, f"{FIREHOSE} deliveries")
    return Verdict(expect=[], facts={"gets_with_ack": GET_WITH_ACK, "gets_without_ack": GET_NO_ACK,
                                     "get_empty": 1, "no_ack_deliveries": FIREHOSE})


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp poller: 3 basic.get with ack, 2 with no_ack, then basic.get-empty; aio-pika consumer "
                 "with no_ack=true and no basic.qos receives 60 messages as fast as they come; a pika producer "
                 "fills both queues. Nothing to flag."),
    drive=drive,
    judge=judge,
)
