"""Confirms out of publish order on one channel: persistent messages to a durable queue wait
for the disk, transient ones to a transient queue do not, so the broker acks later transient
publishes singly before the earlier persistent ones (then covers those with multiple=true)."""

from __future__ import annotations

from tests.lab.clients import amqp_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher

NAME = "out_of_order_confirms"
PUBLISHER = connection_name(NAME, "publisher")
PAIRS = 20


def drive(lab: Lab) -> None:
    durable = lab.queue("durable", durable=True)
    transient = lab.queue("transient")
    messages = []
    for n in range(PAIRS):
        messages.append((b"ledger %d" % n, durable, {"message_id": f"ledger-{n}", "persistent": True}))
        messages.append((b"metric %d" % n, transient, {"message_id": f"metric-{n}"}))
    with lab.recorded(), amqp_connection(PUBLISHER) as connection:
        ConfirmingPublisher(connection).publish_windowed(messages, window=len(messages))


def judge(capture, evidence) -> Verdict:
    entry = expect(evidence, "out_of_order_confirm", PUBLISHER, channel=1)
    first = next(f for f in capture.frames if f.number == entry["evidence_frames"][0])
    require(first.method == "basic.ack" and not first.flag("multiple"),
            "a single basic.ack overtaking an earlier publish")
    return Verdict(expect=[entry], facts={"first_overtaking_ack_tag": first.tag, "publishes": 2 * PAIRS})


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp publisher on one confirm-mode channel alternates 20 persistent messages to a durable "
                 "queue with 20 transient messages to a transient queue; the transient ones are confirmed "
                 "first, singly, and the persistent ones later."),
    drive=drive,
    judge=judge,
)
