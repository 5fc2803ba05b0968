"""Mandatory publishes that no queue takes: the broker sends basic.return, then confirms them
with basic.ack anyway (they were handled: there was nowhere to route them)."""

from __future__ import annotations

from tests.lab.clients import amqp_connection
from tests.lab.expectations import Verdict, expect, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher

NAME = "unroutable_mandatory"
PUBLISHER = connection_name(NAME, "publisher")
UNROUTABLE = 10


def drive(lab: Lab) -> None:
    exchange = lab.exchange("events")
    lab.queue("billing", bind_to=exchange, routing_key="billing")
    # Only unroutable messages: routed ones wait for their queue while unroutable ones are
    # confirmed at once, which would add out-of-order confirms to the picture.
    messages = [(b"event %d" % n, "nobody-listens", {"message_id": f"event-{n}", "exchange": exchange,
                                                    "mandatory": True}) for n in range(UNROUTABLE)]
    with lab.recorded(), amqp_connection(PUBLISHER) as connection:
        publisher = ConfirmingPublisher(connection)
        publisher.publish_windowed(messages, window=UNROUTABLE)
        require(publisher.returned == UNROUTABLE, f"{UNROUTABLE} returns, the client saw {publisher.returned}")


def judge(capture, evidence) -> Verdict:
    returns = capture.methods("basic.return", from_broker=True, connection_name=PUBLISHER)
    require(all(r.args["reply_code"] == "312" for r in returns), "basic.return with 312 NO_ROUTE")
    acks = capture.methods("basic.ack", from_broker=True, connection_name=PUBLISHER)
    require(bool(returns) and bool(acks) and returns[0].number <= acks[0].number,
            "the first basic.return before the first basic.ack")
    return Verdict(expect=[expect(evidence, "unroutable_returned", PUBLISHER, channel=1, at_least=UNROUTABLE)],
                   facts={"unroutable_publishes": UNROUTABLE})


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp publisher in confirm mode sends 10 mandatory messages to a direct exchange with a "
                 "routing key no queue is bound to; each comes back as basic.return (312 NO_ROUTE) before "
                 "its basic.ack."),
    drive=drive,
    judge=judge,
)
