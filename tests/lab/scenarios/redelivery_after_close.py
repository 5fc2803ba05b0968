"""A consumer closes its channel with deliveries unacked; the broker requeues them and another
consumer receives them with redelivered=true."""

from __future__ import annotations

import asyncio

import pika

from tests.lab.clients import aio_connection, amqp_connection, pika_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.waiting import drain_amqp_until

NAME = "redelivery_after_close"
PRODUCER = connection_name(NAME, "producer")
FIRST = connection_name(NAME, "first-consumer")
SECOND = connection_name(NAME, "second-consumer")
MESSAGES, ACKED_BEFORE_CLOSE, PREFETCH = 10, 3, 10


def drive(lab: Lab) -> None:
    queue = lab.queue("emails")
    with lab.recorded():
        with pika_connection(PRODUCER) as producer:
            channel = producer.channel()
            for n in range(MESSAGES):
                channel.basic_publish("", queue, b"email %d" % n, pika.BasicProperties(message_id=f"email-{n}"))
        _take_and_close_unacked(queue)
        asyncio.run(_receive_redelivered(queue, MESSAGES - ACKED_BEFORE_CLOSE))


def _take_and_close_unacked(queue: str) -> None:
    with amqp_connection(FIRST) as connection:
        channel = connection.channel()
        channel.basic_qos(0, PREFETCH, False)
        tags = []
        channel.basic_consume(queue, callback=lambda message: tags.append(message.delivery_tag))
        drain_amqp_until(connection, lambda: len(tags) == MESSAGES, 10, f"{MESSAGES} deliveries")
        for tag in tags[:ACKED_BEFORE_CLOSE]:
            channel.basic_ack(tag)
        channel.close()  # the rest go back to the queue


async def _receive_redelivered(queue_name: str, expected: int) -> None:
    async with await aio_connection(SECOND) as connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.get_queue(queue_name)
        received = 0
        async with queue.iterator() as messages:
            async for message in messages:
                received += 1
                if received == expected:
                    await message.ack(multiple=True)
                    return


def judge(capture, evidence) -> Verdict:
    redelivered = capture.methods("basic.deliver", connection_name=SECOND)
    require(len(redelivered) == MESSAGES - ACKED_BEFORE_CLOSE and all(d.flag("redelivered") for d in redelivered),
            f"{MESSAGES - ACKED_BEFORE_CLOSE} deliveries to the second consumer, all redelivered=true")
    entry = expect(evidence, "redelivery_after_close", FIRST, channel=1)
    return Verdict(expect=[{**entry, "redelivered_on": SECOND}],
                   facts={"delivered_first": MESSAGES, "acked_before_close": ACKED_BEFORE_CLOSE})


SCENARIO = Scenario(
    name=NAME,
    description=("pika producer publishes 10 messages; a py-amqp consumer (prefetch 10) receives all, acks 3 and "
                 "closes its channel; an aio-pika consumer then receives the other 7 with redelivered=true and "
                 "acks them with one multiple=true ack. The finding is pinned to the consumer that closed."),
    drive=drive,
    judge=judge,
)
