"""Transactions on both sides: publishes and acks take effect at tx.commit, and tx.rollback
discards them. A rolled-back ack leaves its delivery unacked, so acking it again is right."""

from __future__ import annotations

import pika

from tests.lab.clients import amqp_connection, pika_connection
from tests.lab.expectations import Verdict, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.waiting import drain_amqp_until

NAME = "transactions"
PUBLISHER = connection_name(NAME, "tx-publisher")
CONSUMER = connection_name(NAME, "tx-consumer")
PER_TRANSACTION = 5


def drive(lab: Lab) -> None:
    queue = lab.queue("payments", durable=True)
    with lab.recorded():
        _publish(queue)
        _consume(queue)


def _publish(queue: str) -> None:
    with pika_connection(PUBLISHER) as connection:
        channel = connection.channel()
        channel.tx_select()
        for outcome in ("committed", "rolled-back"):
            for n in range(PER_TRANSACTION):
                channel.basic_publish("", queue, b"payment %d" % n,
                                      pika.BasicProperties(delivery_mode=2, message_id=f"{outcome}-{n}"))
            channel.tx_commit() if outcome == "committed" else channel.tx_rollback()


def _consume(queue: str) -> None:
    with amqp_connection(CONSUMER) as connection:
        channel = connection.channel()
        channel.basic_qos(0, 10, False)
        channel.tx_select()
        tags: list[int] = []
        channel.basic_consume(queue, callback=lambda message: tags.append(message.delivery_tag))
        drain_amqp_until(connection, lambda: len(tags) == PER_TRANSACTION, 10,
                         f"{PER_TRANSACTION} committed payments (rolled-back ones never reach the queue)")
        channel.basic_ack(tags[0])
        channel.basic_ack(tags[1])
        channel.tx_rollback()  # both acks undone: the deliveries are unacked again
        channel.basic_ack(tags[-1], multiple=True)
        channel.tx_commit()


def judge(capture, evidence) -> Verdict:
    for method in ("tx.select", "tx.commit", "tx.rollback"):
        for name in (PUBLISHER, CONSUMER):
            require(bool(capture.methods(method, from_broker=False, connection_name=name)), f"{method} from {name}")
    require(not capture.methods("channel.close", from_broker=True), "no channel closed by the broker")
    deliveries = capture.methods("basic.deliver", connection_name=CONSUMER)
    require(all(d.message_id.startswith("committed-") for d in deliveries) and len(deliveries) == PER_TRANSACTION,
            "only the committed publishes delivered")
    return Verdict(expect=[], facts={"committed_publishes": PER_TRANSACTION, "rolled_back_publishes": PER_TRANSACTION,
                                     "acks_rolled_back_then_acked_again": 2})


SCENARIO = Scenario(
    name=NAME,
    description=("pika publisher in tx mode: 5 persistent publishes committed, 5 rolled back. py-amqp consumer in "
                 "tx mode (prefetch 10): acks two deliveries, rolls back, then acks all five with multiple=true "
                 "and commits. Nothing to flag: tx publishes are not unconfirmed, re-acks are not double acks."),
    drive=drive,
    judge=judge,
)
