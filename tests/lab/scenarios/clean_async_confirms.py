"""A healthy pair: a publisher streaming persistent messages with a window of outstanding
confirms, and a consumer with prefetch 100 acking first one by one, then in batches with
multiple=true. Nothing to flag.

The publisher is py-amqp, not aio-pika: aio-pika spends longer per publish than the broker
takes to confirm one, so its window never fills and, on the wire, each publish follows the
previous confirm, which is exactly what synchronous confirms look like."""

from __future__ import annotations

import asyncio

from tests.lab.clients import aio_connection, amqp_connection
from tests.lab.expectations import Verdict, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher

NAME = "clean_async_confirms"
PUBLISHER = connection_name(NAME, "publisher")
CONSUMER = connection_name(NAME, "consumer")
MESSAGES, CONFIRM_WINDOW, PREFETCH, BATCH = 80, 20, 100, 10


def drive(lab: Lab) -> None:
    queue = lab.queue("work", durable=True)
    with lab.recorded():
        asyncio.run(_traffic(queue))


async def _traffic(queue_name: str) -> None:
    async with await aio_connection(CONSUMER) as consumer:
        channel = await consumer.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.get_queue(queue_name)
        publishing = asyncio.create_task(asyncio.to_thread(_publish, queue_name))
        await asyncio.wait_for(_consume(queue), timeout=30)
        await publishing


def _publish(queue_name: str) -> None:
    with amqp_connection(PUBLISHER) as connection:
        publisher = ConfirmingPublisher(connection)
        messages = [(b"order %d" % n, queue_name, {"message_id": f"clean-{n}", "persistent": True})
                    for n in range(MESSAGES)]
        publisher.publish_windowed(messages, window=CONFIRM_WINDOW)


async def _consume(queue) -> None:
    # The iterator hands messages over in delivery order, so a multiple=true ack never
    # covers a message that is acked again later.
    received = 0
    async with queue.iterator() as messages:
        async for message in messages:
            received += 1
            if received <= MESSAGES // 2:
                await message.ack()
            elif received % BATCH == 0 or received == MESSAGES:
                await message.ack(multiple=True)
            if received == MESSAGES:
                return


def judge(capture, evidence) -> Verdict:
    publishes = capture.methods("basic.publish", connection_name=PUBLISHER)
    consumer_acks = capture.methods("basic.ack", from_broker=False, connection_name=CONSUMER)
    require(len(publishes) == MESSAGES, f"{MESSAGES} publishes, the capture has {len(publishes)}")
    require(any(a.flag("multiple") for a in consumer_acks) and any(not a.flag("multiple") for a in consumer_acks),
            "consumer acks both single and multiple=true")
    return Verdict(expect=[], facts={
        "publishes": len(publishes),
        "confirm_frames": len(capture.methods("basic.ack", from_broker=True, connection_name=PUBLISHER)),
        "consumer_ack_frames": len(consumer_acks),
    })


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp publisher streams 80 persistent messages to a durable queue, at most 20 awaiting "
                 "confirms; aio-pika consumer with prefetch 100 acks the first half singly, the rest in "
                 "batches of 10 with multiple=true. A healthy pair: nothing to flag."),
    drive=drive,
    judge=judge,
)
