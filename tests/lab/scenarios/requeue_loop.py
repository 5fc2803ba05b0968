"""Poison messages that never leave: a consumer that nacks with requeue=true, one that rejects
with requeue=true, and a dead-letter loop (reject with requeue=false, the dead-letter exchange
routes the message back to its queue, and its x-death count grows). Each consumer gives up
and acks after a fixed number of bounces, so the loop ends inside the capture."""

from __future__ import annotations

import asyncio

import amqp
import pika

from tests.lab.clients import aio_connection, amqp_connection, pika_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.waiting import drain_amqp_until

NAME = "requeue_loop"
PRODUCER = connection_name(NAME, "producer")
NACKING = connection_name(NAME, "nack-consumer")
REJECTING = connection_name(NAME, "reject-consumer")
DEAD_LETTERING = connection_name(NAME, "dead-letter-consumer")
BOUNCES = 24
POISON = {NACKING: "poison-nack", REJECTING: "poison-reject", DEAD_LETTERING: "poison-dead-letter"}


def drive(lab: Lab) -> None:
    nack_queue, reject_queue = lab.queue("nacked"), lab.queue("rejected")
    looped = lab.name("dead-lettered")
    lab.queue("dead-lettered", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": looped})
    with lab.recorded():
        with pika_connection(PRODUCER) as producer:
            channel = producer.channel()
            for queue, consumer in ((nack_queue, NACKING), (reject_queue, REJECTING), (looped, DEAD_LETTERING)):
                channel.basic_publish("", queue, b"malformed order", pika.BasicProperties(message_id=POISON[consumer]))
        asyncio.run(_nack_until_giving_up(nack_queue))
        _reject_until_giving_up(REJECTING, reject_queue, requeue=True)
        _reject_until_giving_up(DEAD_LETTERING, looped, requeue=False)


async def _nack_until_giving_up(queue_name: str) -> None:
    async with await aio_connection(NACKING) as connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1)
        queue = await channel.get_queue(queue_name)
        deliveries = 0
        async with queue.iterator() as messages:
            async for message in messages:
                deliveries += 1
                if deliveries <= BOUNCES:
                    await message.nack(requeue=True)
                else:
                    await message.ack()
                    return


def _reject_until_giving_up(name: str, queue: str, requeue: bool) -> None:
    with amqp_connection(name) as connection:
        channel = connection.channel()
        channel.basic_qos(0, 1, False)
        deliveries = []

        def on_message(message: amqp.Message) -> None:
            deliveries.append(message)
            if len(deliveries) <= BOUNCES:
                channel.basic_reject(message.delivery_tag, requeue=requeue)
            else:
                channel.basic_ack(message.delivery_tag)

        channel.basic_consume(queue, callback=on_message)
        drain_amqp_until(connection, lambda: len(deliveries) > BOUNCES, 20, f"{BOUNCES + 1} deliveries on {name}")


def judge(capture, evidence) -> Verdict:
    looped = capture.methods("basic.deliver", connection_name=DEAD_LETTERING)
    death_counts = [int(d.properties.get("headers", {}).get("x-death", [{}])[0].get("count", 0)) for d in looped]
    require(death_counts and death_counts[-1] == BOUNCES, f"x-death count growing to {BOUNCES}, saw {death_counts}")
    redelivered = capture.methods("basic.deliver", connection_name=NACKING)
    require(sum(d.flag("redelivered") for d in redelivered) == BOUNCES, "nacked message redelivered each time")
    return Verdict(
        expect=[expect(evidence, "requeue_loop", consumer, channel=1, at_least=BOUNCES // 2, message_id=message_id)
                for consumer, message_id in POISON.items()],
        facts={"bounces_per_message": BOUNCES, "final_x_death_count": death_counts[-1]},
    )


SCENARIO = Scenario(
    name=NAME,
    description=("One poison message each: an aio-pika consumer nacks it with requeue=true 24 times, a py-amqp "
                 "consumer rejects it with requeue=true 24 times, a py-amqp consumer rejects it with "
                 "requeue=false 24 times while the queue's dead-letter exchange routes it back (x-death count "
                 "1..24); each then acks it. Prefetch 1 everywhere; a pika producer publishes the three."),
    drive=drive,
    judge=judge,
)
