"""Deliveries piling up unacked while the queue keeps filling: a manual-ack consumer without a
prefetch limit that never acks (everything the queue gets lands on it), and a consumer stuck
at its prefetch limit of 10 (it holds 10, the queue holds the rest)."""

from __future__ import annotations

import time

import pika

from tests.lab.clients import pika_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario

NAME = "unacked_buildup"
PRODUCER = connection_name(NAME, "producer")
UNBOUNDED = connection_name(NAME, "unbounded-consumer")
STUCK = connection_name(NAME, "stuck-consumer")
STUCK_PREFETCH = 10
# Long enough that the first deliveries sit unacked for well over a second (evidence.py);
# one message per queue per tick keeps the capture small.
FILLING_SECONDS, TICK = 2.2, 0.1


def drive(lab: Lab) -> None:
    unbounded_queue = lab.queue("unbounded")
    stuck_queue = lab.queue("stuck")
    with lab.recorded(), pika_connection(PRODUCER) as producer, pika_connection(UNBOUNDED) as unbounded, \
            pika_connection(STUCK) as stuck:
        _consume_without_acking(unbounded.channel(), unbounded_queue, prefetch=None)
        _consume_without_acking(stuck.channel(), stuck_queue, prefetch=STUCK_PREFETCH)
        channel, number, end = producer.channel(), 0, time.monotonic() + FILLING_SECONDS
        while time.monotonic() < end:
            tick_end = time.monotonic() + TICK
            for queue in (unbounded_queue, stuck_queue):
                channel.basic_publish("", queue, b"task %d" % number, pika.BasicProperties(message_id=f"task-{number}"))
                number += 1
            while time.monotonic() < tick_end:
                for connection in (producer, unbounded, stuck):
                    connection.process_data_events(time_limit=0.01)


def _consume_without_acking(channel, queue: str, prefetch: int | None) -> None:
    if prefetch is not None:
        channel.basic_qos(prefetch_count=prefetch)
    channel.basic_consume(queue, on_message_callback=lambda *delivery: None, auto_ack=False)


def judge(capture, evidence) -> Verdict:
    stuck_deliveries = capture.methods("basic.deliver", connection_name=STUCK)
    require(len(stuck_deliveries) == STUCK_PREFETCH, f"the stuck consumer receiving exactly its prefetch of "
            f"{STUCK_PREFETCH}, it got {len(stuck_deliveries)}")
    require(not capture.methods("basic.ack", from_broker=False), "no consumer acks")
    return Verdict(
        expect=[expect(evidence, "unacked_buildup", UNBOUNDED, channel=1, at_least=STUCK_PREFETCH + 5),
                expect(evidence, "unacked_buildup", STUCK, channel=1, at_least=STUCK_PREFETCH),
                expect(evidence, "unbounded_prefetch", UNBOUNDED, channel=1)],
        tolerated={"redelivery_after_close": "both consumers close with their deliveries unacked, so the broker "
                                             "requeues them, but no redelivery is in the capture"},
        facts={"unbounded_deliveries": len(capture.methods("basic.deliver", connection_name=UNBOUNDED)),
               "stuck_prefetch": STUCK_PREFETCH,
               "published": len(capture.methods("basic.publish", connection_name=PRODUCER))},
    )


SCENARIO = Scenario(
    name=NAME,
    description=("pika producer fills two queues for 2 s; a pika manual-ack consumer with no basic.qos never acks "
                 "and keeps receiving (unacked buildup, unbounded prefetch); a pika consumer with prefetch 10 "
                 "never acks and stays at 10 deliveries while its queue grows."),
    drive=drive,
    judge=judge,
)
