"""Real nacks from the broker: a queue capped at 5 messages that rejects further publishes
(x-max-length with x-overflow reject-publish) answers them with basic.nack."""

from __future__ import annotations

from tests.lab.clients import amqp_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher

NAME = "confirm_nacks"
PUBLISHER = connection_name(NAME, "publisher")
QUEUE_LIMIT, MESSAGES = 5, 20


def drive(lab: Lab) -> None:
    queue = lab.queue("capped", arguments={"x-max-length": QUEUE_LIMIT, "x-overflow": "reject-publish"})
    with lab.recorded(), amqp_connection(PUBLISHER) as connection:
        publisher = ConfirmingPublisher(connection)
        publisher.publish_windowed([(b"job %d" % n, queue, {"message_id": f"job-{n}"}) for n in range(MESSAGES)],
                                   window=MESSAGES)
        require(len(publisher.nacked) == MESSAGES - QUEUE_LIMIT,
                f"{MESSAGES - QUEUE_LIMIT} nacks, the client saw {len(publisher.nacked)}")


def judge(capture, evidence) -> Verdict:
    nacks = capture.methods("basic.nack", from_broker=True, connection_name=PUBLISHER)
    require(bool(nacks), "basic.nack from the broker")
    return Verdict(expect=[expect(evidence, "confirm_nack", PUBLISHER, channel=1)],
                   facts={"nack_frames": len(nacks), "queue_limit": QUEUE_LIMIT, "publishes": MESSAGES})


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp publisher in confirm mode sends 20 transient messages to a queue with x-max-length 5 "
                 "and x-overflow reject-publish: the broker acks 5 and nacks 15."),
    drive=drive,
    judge=judge,
)
