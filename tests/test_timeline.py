"""The per-channel timelines (analyzer.timeline): whole conversations written as frame rows, the
recorded lab examples, and random valid traffic."""

import glob
import json
import os
import random
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import schema
from analyzer.ingest import decode
from analyzer.timeline import (CHANNELS, VIOLATIONS, ChannelFacts, Delivery, Publish, TimelineInputError, Timelines,
                               Violation, replay, replay_frames, to_tables)

from .conftest import ROOT

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
MAX_TAG = 2**63 - 1
T0 = 1_795_000_000_000_000_000


class Conv:
    """One connection's frame rows, written the way the decoder writes them: `c` from the
    client, `b` from the broker, each a millisecond after the last."""

    def __init__(self, connection_id="10.0.0.1:40000>10.0.0.2:5672@1", start=T0, midstream=False):
        self.id, self.rows, self.ts = connection_id, [], start
        if midstream:
            self.b(0, "capture.midstream", gap_bytes=0)
            self.c(0, "capture.midstream", gap_bytes=0)
        else:
            self.c(0, "amqp.protocol-header")

    def _row(self, direction, channel, method, fields):
        self.ts += 1_000_000
        row = {"connection_id": self.id, "agent_id": "test", "seq": len(self.rows) + 1, "ts_ns": self.ts,
               "direction": direction, "channel": channel, "method": method, **fields}
        self.rows.append(row)
        return row["seq"]

    def c(self, channel, method, **fields):
        return self._row("to_broker", channel, method, fields)

    def b(self, channel, method, **fields):
        return self._row("to_client", channel, method, fields)

    # shorthands for the common frames
    def open(self, ch):
        self.c(ch, "channel.open")
        self.b(ch, "channel.open-ok")

    def close(self, ch, by="client", code=200, text="bye", failing=None):
        closer, peer = (self.c, self.b) if by == "client" else (self.b, self.c)
        seq = closer(ch, "channel.close", reply_code=code, reply_text=text, failing_method=failing)
        peer(ch, "channel.close-ok")
        return seq

    def consume(self, ch, tag="ctag", queue="q", no_ack=False):
        self.c(ch, "basic.consume", queue=queue, consumer_tag="", no_ack=no_ack, nowait=False)
        self.b(ch, "basic.consume-ok", consumer_tag=tag)

    def deliver(self, ch, tag, ctag="ctag", msg=None, redelivered=False):
        msg = msg or f"m{tag}"
        return self.b(ch, "basic.deliver", delivery_tag=tag, consumer_tag=ctag, exchange="", routing_key="q",
                      redelivered=redelivered, message_id=msg, message_identity="id:" + msg)

    def ack(self, ch, tag, multiple=False, method="basic.ack", requeue=None, to="broker"):
        fields = {"delivery_tag": tag}
        if method != "basic.reject":
            fields["multiple"] = multiple
        if method != "basic.ack":
            fields["requeue"] = requeue
        return (self.c if to == "broker" else self.b)(ch, method, **fields)

    def confirm(self, ch, tag, multiple=False, nack=False):
        return self.ack(ch, tag, multiple, method="basic.nack" if nack else "basic.ack", to="client")

    def publish(self, ch, msg, mandatory=False, persistent=True, routing_key="q"):
        return self.c(ch, "basic.publish", exchange="", routing_key=routing_key, mandatory=mandatory,
                      delivery_mode=2 if persistent else 1, message_id=msg, message_identity="id:" + msg)


def run(*convs):
    rows = sorted((row for conv in convs for row in conv.rows), key=lambda x: (x["connection_id"], x["seq"]))
    return Result(replay(rows))


class Result:
    def __init__(self, records):
        self.records = records
        self.deliveries = [x for x in records if isinstance(x, Delivery)]
        self.publishes = [x for x in records if isinstance(x, Publish)]
        self.channels = [x for x in records if isinstance(x, ChannelFacts)]
        self.violations = [x for x in records if isinstance(x, Violation)]
        keys = [(x.connection_id, x.channel, x.incarnation, x.seq) for x in self.deliveries + self.publishes]
        assert len(keys) == len(set(keys)), "a delivery or publish came out twice"

    def delivery(self, tag, channel=1, incarnation=None):
        found = [d for d in self.deliveries if d.delivery_tag == tag and d.channel == channel
                 and (incarnation is None or d.incarnation == incarnation)]
        assert len(found) == 1, found
        return found[0]

    def outcomes(self, channel=1, incarnation=None):
        return {d.delivery_tag: d.outcome for d in self.deliveries
                if d.channel == channel and (incarnation is None or d.incarnation == incarnation)}

    def publish(self, msg):
        found = [p for p in self.publishes if p.message_id == msg]
        assert len(found) == 1, found
        return found[0]

    def publish_outcomes(self):
        return {p.message_id: p.outcome for p in self.publishes}


# -- consumer side ----------------------------------------------------------------------------------

def test_single_and_multiple_acks_settle_each_delivery_once():
    conv = Conv()
    conv.open(1)
    conv.c(1, "basic.qos", prefetch_count=3, prefetch_size=0, prefetch_global=False)
    conv.consume(1)
    for tag in range(1, 6):
        conv.deliver(1, tag)
    conv.ack(1, 2)
    multiple = conv.ack(1, 4, multiple=True)  # settles 1, 3 and 4; 2 was acked singly before
    last = conv.ack(1, 5)
    result = run(conv)
    assert result.outcomes() == {1: "ack", 2: "ack", 3: "ack", 4: "ack", 5: "ack"}
    assert [result.delivery(t).settled_by_multiple for t in range(1, 6)] == [True, False, True, True, False]
    three = result.delivery(3)
    assert (three.settle_tag, three.settle_frame_seq, three.settle_seq) == (4, multiple, multiple)
    assert three.settle_latency_ns == three.settle_ts_ns - three.ts_ns == (multiple - three.seq) * 1_000_000
    assert (three.queue, three.consumer_tag, three.no_ack, three.consumer_prefetch, three.channel_prefetch) == \
        ("q", "ctag", False, 3, 0)
    assert result.delivery(5).settle_seq == last
    assert result.violations == []
    [facts] = result.channels
    assert (facts.peak_unacked, facts.consumes, facts.unbounded_manual_consumes, facts.ended_by) == \
        (5, 1, 0, "end_of_data")  # prefetch 3 with 5 unacked: the window can overshoot; we report it


def test_multiple_with_tag_zero_settles_everything_outstanding():
    conv = Conv()
    conv.open(1)
    conv.consume(1)
    for tag in (1, 2, 3):
        conv.deliver(1, tag)
    conv.ack(1, 2)
    zero = conv.ack(1, 0, multiple=True, method="basic.nack", requeue=True)
    conv.ack(1, 0, multiple=True)  # nothing outstanding: still no error in RabbitMQ
    result = run(conv)
    assert result.outcomes() == {1: "nack", 2: "ack", 3: "nack"}
    assert result.delivery(3).settle_seq == zero and result.delivery(3).requeue is True
    assert result.delivery(3).settle_tag == 0 and result.delivery(3).settled_by_multiple
    assert result.violations == []


def test_multiple_naming_a_tag_already_settled_is_a_double_ack():
    """RabbitMQ's collect_acks needs the named tag itself outstanding, even with multiple=true."""
    conv = Conv()
    conv.open(1)
    conv.consume(1)
    for tag in (1, 2, 3):
        conv.deliver(1, tag)
    conv.ack(1, 3)
    bad = conv.ack(1, 3, multiple=True)
    conv.ack(1, 1)  # in flight behind the bad ack: the broker discards it
    close = conv.close(1, by="broker", code=406, text="PRECONDITION_FAILED - unknown delivery tag 3",
                       failing="basic.ack")
    result = run(conv)
    assert result.outcomes() == {1: "channel_closed", 2: "channel_closed", 3: "ack"}
    [violation] = result.violations
    assert (violation.kind, violation.seq, violation.delivery_tag, violation.multiple, violation.evidence) == \
        ("double_ack", bad, 3, True, "capture")
    assert (violation.broker_close_seq, violation.broker_reply_code) == (close, 406)


def test_nack_and_reject_with_and_without_requeue():
    conv = Conv()
    conv.open(1)
    conv.consume(1)
    for tag in range(1, 5):
        conv.deliver(1, tag)
    conv.ack(1, 1, method="basic.nack", requeue=True)
    conv.ack(1, 2, method="basic.nack", requeue=False)
    conv.ack(1, 3, method="basic.reject", requeue=True)
    conv.ack(1, 4, method="basic.reject", requeue=False)
    result = run(conv)
    assert [(d.outcome, d.requeue, d.settled_by_multiple) for d in sorted(result.deliveries, key=lambda d: d.seq)] == [
        ("nack", True, False), ("nack", False, False), ("reject", True, False), ("reject", False, False)]


def test_auto_ack_deliveries_are_settled_on_send():
    conv = Conv()
    conv.open(1)
    conv.consume(1, tag="fast", no_ack=True)
    conv.deliver(1, 1, ctag="fast")
    conv.deliver(1, 2, ctag="fast")
    conv.c(1, "basic.get", queue="polled", no_ack=True)
    conv.b(1, "basic.get-ok", delivery_tag=3, exchange="", routing_key="polled", redelivered=False, message_count=0)
    conv.c(0, "tcp.rst")
    result = run(conv)
    assert result.outcomes() == {1: "auto", 2: "auto", 3: "auto"}
    assert all(d.no_ack and d.settle_latency_ns == 0 and d.settle_seq == d.seq for d in result.deliveries)
    assert result.delivery(3).queue == "polled"


def test_basic_get_ok_takes_queue_and_mode_from_its_get_and_ignores_prefetch():
    conv = Conv()
    conv.open(1)
    conv.c(1, "basic.qos", prefetch_count=1, prefetch_global=True)
    conv.c(1, "basic.get", queue="empty", no_ack=False)
    conv.b(1, "basic.get-empty")
    conv.c(1, "basic.get", queue="jobs", no_ack=False)
    conv.b(1, "basic.get-ok", delivery_tag=1, exchange="", routing_key="jobs", redelivered=True, message_count=4,
           message_id="job", message_identity="id:job")
    conv.ack(1, 1)
    result = run(conv)
    got = result.delivery(1)
    assert (got.method, got.queue, got.no_ack, got.outcome, got.redelivered) == ("basic.get-ok", "jobs", False, "ack", True)
    assert got.consumer_prefetch is None and got.channel_prefetch is None and got.consumer_tag is None


def test_prefetch_in_force_per_consumer_and_per_channel():
    conv = Conv()
    conv.open(1)
    conv.consume(1, tag="unbounded")  # manual ack, no limit: flagged
    conv.c(1, "basic.qos", prefetch_count=50, prefetch_global=False)
    conv.consume(1, tag="per-consumer")
    conv.c(1, "basic.qos", prefetch_count=200, prefetch_global=True)
    conv.deliver(1, 1, ctag="unbounded")
    conv.deliver(1, 2, ctag="per-consumer")
    result = run(conv)
    assert [(d.consumer_prefetch, d.channel_prefetch) for d in result.deliveries] == [(0, 200), (50, 200)]
    [facts] = result.channels
    assert (facts.consumer_prefetch, facts.channel_prefetch, facts.consumes, facts.unbounded_manual_consumes) == \
        (50, 200, 2, 1)


def test_basic_recover_resends_the_unacked_deliveries():
    conv = Conv()
    conv.open(1)
    conv.consume(1)
    for tag in (1, 2, 3):
        conv.deliver(1, tag)
    conv.ack(1, 1)
    recover = conv.c(1, "basic.recover", requeue=True)
    conv.b(1, "basic.recover-ok")
    conv.deliver(1, 4, msg="m2", redelivered=True)
    conv.deliver(1, 5, msg="m3", redelivered=True)
    conv.ack(1, 5, multiple=True)
    conv.c(1, "basic.recover-async", requeue=True)  # nothing outstanding any more
    result = run(conv)
    assert result.outcomes() == {1: "ack", 2: "recovered", 3: "recovered", 4: "ack", 5: "ack"}
    assert result.delivery(2).settle_seq == recover and result.delivery(2).requeue is True
    assert result.violations == []


def test_channel_numbers_are_reused_with_fresh_tags_and_confirm_numbers():
    conv = Conv()
    conv.open(1)
    conv.c(1, "confirm.select", nowait=False)
    conv.publish(1, "first-1")
    conv.publish(1, "first-2")
    conv.consume(1)
    conv.deliver(1, 1)
    conv.deliver(1, 2)
    conv.confirm(1, 1)
    conv.ack(1, 1)
    first_close = conv.close(1)
    conv.open(1)
    conv.c(1, "confirm.select", nowait=False)
    conv.publish(1, "second-1")
    conv.confirm(1, 1)
    conv.consume(1, tag="again")
    conv.deliver(1, 1, ctag="again", msg="m2", redelivered=True)
    conv.ack(1, 1)
    result = run(conv)
    assert result.outcomes(incarnation=1) == {1: "ack", 2: "channel_closed"}
    assert result.delivery(2, incarnation=1).settle_seq == first_close
    assert result.outcomes(incarnation=2) == {1: "ack"}
    assert result.publish_outcomes() == {"first-1": "acked", "first-2": "lost", "second-1": "acked"}
    assert [result.publish(m).confirm_seq for m in ("first-1", "first-2", "second-1")] == [1, 2, 1]
    assert [(c.incarnation, c.ended_by, c.closed_by) for c in result.channels] == \
        [(1, "channel.close", "client"), (2, "end_of_data", None)]
    assert result.channels[1].open_seq == result.delivery(1, incarnation=2).channel_open_seq
    assert result.violations == []


def test_transactions_apply_acks_and_publishes_at_commit_and_rollback_discards_them():
    conv = Conv()
    conv.open(1)
    conv.c(1, "tx.select")
    conv.b(1, "tx.select-ok")
    conv.consume(1)
    for tag in (1, 2, 3):
        conv.deliver(1, tag)
    conv.publish(1, "kept")
    conv.ack(1, 1)
    conv.ack(1, 2)
    conv.c(1, "tx.rollback")  # both acks undone: 1 and 2 are unacked again, "kept" is gone
    conv.publish(1, "committed")
    ack_all = conv.ack(1, 3, multiple=True)  # acking 1 and 2 again is not a double ack
    commit = conv.c(1, "tx.commit")
    conv.b(1, "tx.commit-ok")
    conv.publish(1, "uncommitted")
    conv.deliver(1, 4)
    conv.ack(1, 4)
    close = conv.close(1)  # the open transaction dies with its channel
    result = run(conv)
    assert result.outcomes() == {1: "ack", 2: "ack", 3: "ack", 4: "channel_closed"}
    one = result.delivery(1)
    assert (one.in_tx, one.settle_frame_seq, one.settle_seq) == (True, ack_all, commit)
    assert result.publish_outcomes() == {"kept": "rolled_back", "committed": "committed", "uncommitted": "lost"}
    assert {p.mode for p in result.publishes} == {"tx"}
    assert result.publish("committed").settle_seq == commit and result.publish("uncommitted").settle_seq == close
    assert result.violations == []


def test_a_double_ack_inside_a_transaction_is_caught_at_once():
    conv = Conv()
    conv.open(1)
    conv.c(1, "tx.select")
    conv.consume(1)
    conv.deliver(1, 1)
    conv.ack(1, 1)
    bad = conv.ack(1, 1)
    result = run(conv)
    assert [(v.kind, v.seq) for v in result.violations] == [("double_ack", bad)]
    assert result.outcomes() == {1: "open"}  # its ack was never committed


# -- publisher side -----------------------------------------------------------------------------------

def test_confirms_out_of_order_and_multiple_covering_tags_confirmed_singly():
    conv = Conv()
    conv.open(1)
    conv.c(1, "confirm.select", nowait=False)
    conv.b(1, "confirm.select-ok")
    for n in range(1, 6):
        conv.publish(1, f"p{n}", persistent=n % 2 == 1)
    conv.confirm(1, 2)      # 1 still waiting: out of order by one
    conv.confirm(1, 4)      # 1 and 3 still waiting: three numbers ahead of the oldest
    conv.confirm(1, 5, multiple=True)  # 1 and 3 in order; 2 and 4 were confirmed singly already
    result = run(conv)
    got = {p.message_id: (p.outcome, p.out_of_order, p.out_of_order_by, p.confirm_tag, p.confirm_multiple)
           for p in result.publishes}
    assert got == {"p1": ("acked", False, 0, 5, True), "p2": ("acked", True, 1, 2, False),
                   "p3": ("acked", False, 0, 5, True), "p4": ("acked", True, 3, 4, False),
                   "p5": ("acked", False, 0, 5, True)}
    assert [result.publish(f"p{n}").pending_before for n in range(1, 6)] == [0, 1, 2, 3, 4]
    assert [result.publish(f"p{n}").persistent for n in range(1, 6)] == [True, False, True, False, True]


def test_nacks_and_confirm_tag_zero():
    conv = Conv()
    conv.open(1)
    conv.c(1, "confirm.select", nowait=True)
    for n in range(1, 4):
        conv.publish(1, f"p{n}")
    nack = conv.confirm(1, 1, nack=True)
    conv.confirm(1, 0, multiple=True)
    result = run(conv)
    assert result.publish_outcomes() == {"p1": "nacked", "p2": "acked", "p3": "acked"}
    p1 = result.publish("p1")
    assert p1.settle_seq == nack and p1.settle_latency_ns == (nack - p1.seq) * 1_000_000


def test_mandatory_return_comes_before_the_ack():
    conv = Conv()
    conv.open(1)
    conv.c(1, "confirm.select", nowait=False)
    conv.publish(1, "routed", mandatory=True)
    conv.publish(1, "nowhere", mandatory=True, routing_key="nobody")
    returned = conv.b(1, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="nobody",
                      message_id="nowhere", message_identity="id:nowhere")
    conv.confirm(1, 2)
    conv.confirm(1, 1)
    conv.open(2)  # without confirm mode a return can still name a mandatory publish
    conv.publish(2, "plain", mandatory=True, routing_key="nobody")
    conv.b(2, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="nobody",
           message_id="plain", message_identity="id:plain")
    result = run(conv)
    nowhere = result.publish("nowhere")
    assert (nowhere.outcome, nowhere.return_code, nowhere.return_text, nowhere.return_seq) == \
        ("acked", 312, "NO_ROUTE", returned)
    assert result.publish("routed").return_code is None
    plain = result.publish("plain")
    assert (plain.mode, plain.outcome, plain.return_code) == ("none", "untracked", 312)


def test_plain_publishes_are_untracked_never_lost():
    conv = Conv()
    conv.open(1)
    conv.publish(1, "fire-and-forget")
    conv.c(0, "tcp.rst")
    result = run(conv)
    assert result.publish_outcomes() == {"fire-and-forget": "untracked"}
    assert result.publish("fire-and-forget").settle_ts_ns is None


# -- ends -------------------------------------------------------------------------------------------

def _busy(conv, ch=1):
    """A confirm-mode publisher and a manual-ack consumer on channel `ch`, each with one item open."""
    conv.open(ch)
    conv.c(ch, "confirm.select", nowait=False)
    conv.publish(ch, f"done-{ch}")
    conv.publish(ch, f"waiting-{ch}")
    conv.confirm(ch, 1)
    conv.consume(ch)
    conv.deliver(ch, 1, msg=f"acked-{ch}")
    conv.deliver(ch, 2, msg=f"unacked-{ch}")
    conv.ack(ch, 1)


@pytest.mark.parametrize("end", ["tcp.fin", "tcp.rst", "connection.close"])
def test_fin_rst_or_connection_close_loses_what_is_unconfirmed(end):
    conv = Conv()
    _busy(conv)
    ending = conv.c(0, end, reply_code=320) if end == "connection.close" else conv.b(0, end)
    result = run(conv)
    assert result.outcomes() == {1: "ack", 2: "connection_closed"}
    assert result.publish_outcomes() == {"done-1": "acked", "waiting-1": "lost"}
    assert result.publish("waiting-1").settle_seq == ending == result.delivery(2).settle_seq
    assert result.channels[0].ended_by == end


def test_frames_after_a_fin_still_count():
    conv = Conv()
    _busy(conv)
    fin = conv.c(0, "tcp.fin")
    conv.confirm(1, 2)  # the broker's confirm was in flight
    conv.deliver(1, 3, msg="late")
    result = run(conv)
    assert result.publish_outcomes()["waiting-1"] == "acked"
    assert result.outcomes() == {1: "ack", 2: "connection_closed", 3: "connection_closed"}
    assert result.delivery(2).settle_seq == fin and result.delivery(3).settle_seq == result.delivery(3).seq


def test_end_of_data_leaves_things_open_not_lost():
    conv = Conv()
    _busy(conv)
    conv.c(0, "heartbeat")
    last_ts = conv.ts
    result = run(conv)
    assert result.outcomes() == {1: "ack", 2: "open"}
    assert result.publish_outcomes() == {"done-1": "acked", "waiting-1": "open"}
    waiting, unacked = result.publish("waiting-1"), result.delivery(2)
    assert waiting.observed_until_ts_ns == unacked.observed_until_ts_ns == last_ts
    assert waiting.settle_ts_ns is None and unacked.settle_seq is None
    assert result.publish("done-1").observed_until_ts_ns is None
    assert result.channels[0].observed_until_ts_ns == last_ts


def test_after_the_closer_sends_close_it_discards_what_arrives():
    conv = Conv()
    _busy(conv)
    conv.c(1, "channel.close", reply_code=200, reply_text="bye")
    conv.confirm(1, 2)                   # discarded by the closing client: still lost
    conv.deliver(1, 3, msg="in-flight")  # ditto: back to the queue
    conv.b(1, "channel.close-ok")
    result = run(conv)
    assert result.publish_outcomes()["waiting-1"] == "lost"
    assert result.outcomes() == {1: "ack", 2: "channel_closed", 3: "channel_closed"}


def test_connections_are_independent():
    first, second = Conv("a"), Conv("b")
    _busy(first)
    _busy(second)
    first.c(0, "tcp.rst")
    result = run(first, second)
    assert Counter((p.connection_id, p.outcome) for p in result.publishes) == \
        {("a", "acked"): 1, ("a", "lost"): 1, ("b", "acked"): 1, ("b", "open"): 1}


# -- violations ------------------------------------------------------------------------------------

def test_unknown_tag_and_ack_on_the_wrong_channel():
    conv = Conv()
    conv.open(1)
    conv.open(2)
    conv.open(3)
    conv.c(1, "basic.get", queue="q", no_ack=False)
    conv.b(1, "basic.get-ok", delivery_tag=1, exchange="", routing_key="q", redelivered=False)
    never = conv.ack(2, 42)
    wrong = conv.ack(3, 1)
    conv.close(2, by="broker", code=406, text="PRECONDITION_FAILED - unknown delivery tag 42", failing="basic.ack")
    conv.close(3, by="broker", code=406, text="PRECONDITION_FAILED - unknown delivery tag 1", failing="basic.ack")
    conv.ack(1, 1)
    result = run(conv)
    got = [(v.channel, v.seq, v.kind, v.delivery_tag, v.delivered_channel, v.broker_reply_code)
           for v in result.violations]
    assert got == [(2, never, "unknown_tag", 42, None, 406), (3, wrong, "wrong_channel", 1, 1, 406)]
    assert result.outcomes() == {1: "ack"}


def test_violations_need_a_channel_seen_whole():
    """Mid-stream, tags from before the capture are not unknown to the broker."""
    conv = Conv(midstream=True)
    conv.deliver(1, 5001)
    conv.ack(1, 4000)                 # delivered before the capture
    conv.ack(1, 4990, multiple=True)  # ditto
    conv.ack(1, 5001)
    conv.ack(1, 5001)  # a double ack even here, but we leave it to the broker to say so
    close = conv.close(1, by="broker", code=406, text="PRECONDITION_FAILED - unknown delivery tag 5001",
                       failing="basic.ack")
    result = run(conv)
    [violation] = result.violations
    assert (violation.evidence, violation.kind, violation.delivery_tag, violation.seq) == \
        ("broker", "double_ack", 5001, close)


# -- imperfect captures -----------------------------------------------------------------------------

def test_acks_and_confirms_the_capture_shows_before_their_delivery_or_publish():
    """Captures reorder the two directions (the decoder lets ACKs run ahead of data)."""
    conv = Conv()
    conv.open(1)
    conv.c(1, "confirm.select", nowait=False)
    conv.consume(1)
    conv.deliver(1, 1)
    conv.ack(1, 2)                   # shown before delivery 2
    conv.ack(1, 4, multiple=True)    # settles 1 now, 3 and 4 when they show up
    conv.ack(1, 9)                   # never delivered, and no 406 follows: not a violation we can prove
    conv.confirm(1, 1)               # shown before publish 1
    conv.confirm(1, 3, multiple=True)
    for tag in (2, 3, 4, 5):
        conv.deliver(1, tag)
    for n in (1, 2, 3, 4):
        conv.publish(1, f"p{n}")
    conv.b(1, "channel.close-ok")    # the close-ok shown before its close
    conv.c(1, "channel.close", reply_code=200, reply_text="bye")
    conv.open(1)
    result = run(conv)
    assert result.outcomes(incarnation=1) == {1: "ack", 2: "ack", 3: "ack", 4: "ack", 5: "channel_closed"}
    two = result.delivery(2)
    assert (two.settle_frame_seq < two.seq, two.settle_seq, two.settle_latency_ns) == (True, two.seq, 0)
    assert result.publish_outcomes() == {"p1": "acked", "p2": "acked", "p3": "acked", "p4": "lost"}
    assert (result.publish("p1").confirm_multiple, result.publish("p2").confirm_multiple) == (False, True)
    assert result.violations == []
    assert [c.incarnation for c in result.channels] == [1, 2]


def test_mid_stream_start_flags_nothing_and_loses_nothing():
    publisher, consumer = Conv("pub", midstream=True), Conv("con", midstream=True)
    for n in range(1010, 1016):
        publisher.publish(1, f"event-{n}")
    publisher.confirm(1, 1012, multiple=True)
    publisher.confirm(1, 1016)
    for tag in range(MAX_TAG - 5, MAX_TAG + 1):
        consumer.deliver(1, tag, ctag="busy")
    consumer.ack(1, MAX_TAG - 10, multiple=True)  # tags before the capture, as well
    consumer.ack(1, MAX_TAG - 3, multiple=True)
    consumer.ack(1, 7)
    consumer.open(2)  # opened inside the capture with both directions in view: seen whole
    consumer.ack(2, 1)
    consumer.close(2, by="broker", code=406, text="PRECONDITION_FAILED - unknown delivery tag 1", failing="basic.ack")
    publisher.c(0, "tcp.fin")
    consumer.c(0, "tcp.fin")
    result = run(publisher, consumer)
    assert {p.outcome for p in result.publishes} == {"unknown"}
    assert {p.mode for p in result.publishes} == {"unknown"} and all(p.confirm_seq is None for p in result.publishes)
    # The consumer's mode was not captured, but it acked its exact tag MAX_TAG - 3: manual ack.
    assert result.outcomes() == {MAX_TAG - 5: "ack", MAX_TAG - 4: "ack", MAX_TAG - 3: "ack",
                                 MAX_TAG - 2: "connection_closed", MAX_TAG - 1: "connection_closed",
                                 MAX_TAG: "connection_closed"}
    assert all(d.no_ack is None and d.queue is None for d in result.deliveries)
    assert [(v.channel, v.kind) for v in result.violations] == [(2, "unknown_tag")]
    tables = to_tables(result.records)
    assert tables["deliveries"]["delivery_tag"].to_pylist()[-1] == MAX_TAG


def test_deliveries_of_a_consumer_whose_mode_is_unknown_end_unknown():
    conv = Conv(midstream=True)
    conv.deliver(1, 100, ctag="maybe-auto")
    conv.deliver(1, 101, ctag="maybe-auto")
    conv.c(0, "tcp.rst")
    conv.b(0, "capture.gap", gap_bytes=10)  # released by reassembly after the RST
    result = run(conv)
    assert result.outcomes() == {100: "unknown", 101: "unknown"}


def test_gap_in_the_clients_direction():
    conv = Conv()
    _busy(conv)
    conv.c(0, "capture.gap", gap_bytes=1400)
    conv.ack(1, 2)                # may repeat an ack the gap hid: no violation
    conv.ack(1, 77)               # may name a tag the gap hid: no violation
    conv.publish(1, "after-gap")  # a publish in the gap would shift its number
    conv.confirm(1, 2)            # the confirm stream is whole: "waiting-1" is number 2
    conv.deliver(1, 3)
    conv.c(0, "tcp.fin")
    result = run(conv)
    assert result.outcomes() == {1: "ack", 2: "unknown", 3: "connection_closed"}
    assert result.delivery(2).settle_ts_ns is None
    assert result.publish_outcomes() == {"done-1": "acked", "waiting-1": "acked", "after-gap": "unknown"}
    assert result.violations == [] and result.channels[0].gap_seen


def test_gap_in_the_brokers_direction():
    conv = Conv()
    _busy(conv)
    conv.b(0, "capture.gap", gap_bytes=1400)  # may hold the confirm of "waiting-1"
    conv.ack(1, 9)                   # a delivery the gap hid: no violation
    conv.publish(1, "after-gap")     # numbering still aligned: the client's direction is whole
    conv.confirm(1, 3)
    conv.publish(1, "never-confirmed")
    conv.b(0, "tcp.rst")
    result = run(conv)
    assert result.publish_outcomes() == {"done-1": "acked", "waiting-1": "unknown", "after-gap": "acked",
                                         "never-confirmed": "lost"}
    assert result.publish("after-gap").confirm_seq == 3
    assert result.publish("after-gap").pending_before is None  # "waiting-1" may or may not still be pending
    assert result.outcomes() == {1: "ack", 2: "connection_closed"}
    assert result.violations == []


def test_a_close_is_final_only_once_the_peer_has_answered():
    """The decoder reports a hole only when the bytes after it arrive: a gap in the peer's
    direction between a close and its close-ok may hide what settled things before the close."""
    conv = Conv()
    _busy(conv)
    conv.c(1, "channel.close", reply_code=200, reply_text="bye")
    conv.b(0, "capture.gap", gap_bytes=40)  # perhaps the confirm of "waiting-1"
    conv.b(1, "channel.close-ok")
    _busy(conv, ch=2)
    conv.b(2, "channel.close", reply_code=404, reply_text="NOT_FOUND", failing_method="basic.publish")
    conv.c(0, "capture.gap", gap_bytes=40)  # perhaps the ack of "unacked-2"
    conv.c(2, "channel.close-ok")
    result = run(conv)
    assert result.publish_outcomes() == {"done-1": "acked", "waiting-1": "unknown", "done-2": "acked", "waiting-2": "lost"}
    assert result.outcomes(channel=1) == {1: "ack", 2: "channel_closed"}  # acks travel the other way
    assert result.outcomes(channel=2) == {1: "ack", 2: "unknown"}


@pytest.mark.parametrize("then", ["gap", "more data"])
def test_a_close_ok_whose_close_is_missing(then):
    conv = Conv()
    _busy(conv)
    conv.c(1, "channel.close-ok")  # the broker's channel.close is not in the data
    if then == "gap":
        conv.b(0, "capture.gap", gap_bytes=60)  # it was lost, perhaps with the confirm before it
    conv.b(0, "heartbeat")
    result = run(conv)
    assert result.publish_outcomes()["waiting-1"] == ("unknown" if then == "gap" else "lost")
    assert result.outcomes() == {1: "ack", 2: "channel_closed"}
    assert (result.channels[0].ended_by, result.channels[0].closed_by) == ("channel.close", "broker")


def test_select_ok_and_commit_ok_show_what_a_gap_hid():
    conv = Conv()
    conv.open(1)
    conv.consume(1)
    conv.deliver(1, 1)
    conv.deliver(1, 2)
    conv.b(1, "tx.select-ok")  # its tx.select was lost; the hole is reported at the next client bytes
    conv.c(0, "capture.gap", gap_bytes=20)  # 1 and 2 may have been acked in it
    conv.deliver(1, 3)
    conv.ack(1, 3)             # in a transaction, thanks to the select-ok: takes effect at commit
    conv.c(0, "tcp.rst")       # never committed
    conv.open(2)
    conv.b(2, "confirm.select-ok")  # shown before its select: numbering still known
    conv.c(2, "confirm.select", nowait=False)
    conv.publish(2, "numbered")
    conv.confirm(2, 1)
    result = run(conv)
    assert result.outcomes() == {1: "unknown", 2: "unknown", 3: "connection_closed"}  # 1, 2: unknown at the gap
    assert result.channels[0].tx_mode is True
    assert result.publish("numbered").outcome == "acked" and result.publish("numbered").confirm_seq == 1


def test_acks_in_transactions_the_capture_missed_commit_when_the_reply_shows():
    conv = Conv()
    conv.open(1)
    conv.c(1, "tx.select")
    conv.consume(1)
    conv.deliver(1, 1)
    conv.ack(1, 1)
    commit_ok = conv.b(1, "tx.commit-ok")  # its commit went missing and no gap was reported yet
    conv.c(1, "tx.commit")   # a commit that is answered below: no double counting
    conv.deliver(1, 2)
    conv.ack(1, 2)
    conv.c(1, "tx.commit")
    conv.b(1, "tx.commit-ok")
    conv.b(1, "tx.commit-ok")
    result = run(conv)
    assert result.outcomes() == {1: "ack", 2: "ack"}
    assert result.delivery(1).settle_seq == commit_ok


def test_acking_an_auto_ack_delivery_is_a_violation_either_way_round():
    conv = Conv()
    conv.open(1)
    conv.consume(1, tag="auto", no_ack=True)
    conv.deliver(1, 1, ctag="auto")
    after = conv.ack(1, 1)
    conv.open(2)
    conv.consume(2, tag="auto", no_ack=True)
    before = conv.ack(2, 1)  # the capture shows it before the delivery it names
    conv.deliver(2, 1, ctag="auto")
    result = run(conv)
    assert [(v.channel, v.seq, v.kind) for v in result.violations] == [(1, after, "double_ack"), (2, before, "double_ack")]
    assert set(result.outcomes(channel=1).values()) == set(result.outcomes(channel=2).values()) == {"auto"}


def test_a_multiple_ack_settles_deliveries_of_unknown_ack_mode_only_if_provably_manual():
    conv = Conv(midstream=True)
    conv.deliver(1, 10, ctag="manual")
    conv.deliver(1, 11, ctag="either")
    conv.deliver(1, 12, ctag="manual")
    conv.ack(1, 12, multiple=True)  # names a "manual" tag exactly: that consumer acks by hand
    conv.deliver(1, 13, ctag="manual")
    conv.deliver(1, 14, ctag="either")
    conv.ack(1, 0, multiple=True)
    result = run(conv)
    assert result.outcomes() == {10: "ack", 11: "unknown", 12: "ack", 13: "ack", 14: "unknown"}
    assert result.delivery(11).settle_seq == result.delivery(12).settle_seq  # we know when, not whether


def test_a_channel_whose_open_was_missed_is_a_new_unknown_incarnation():
    conv = Conv()
    conv.open(1)
    conv.consume(1)
    for tag in (1, 2, 3):
        conv.deliver(1, tag)
    conv.deliver(1, 1, msg="again")  # tags restarted: a close and open went by unseen
    conv.ack(1, 5)
    result = run(conv)
    assert result.outcomes(incarnation=1) == {1: "unknown", 2: "unknown", 3: "unknown"}
    assert result.outcomes(incarnation=2) == {1: "unknown"}
    assert [c.ended_by for c in result.channels] == ["tag_restart", "end_of_data"]
    assert result.violations == []


def test_rows_out_of_order_are_the_callers_fault():
    conv = Conv()
    conv.open(1)
    timelines = Timelines()
    timelines.feed(conv.rows[1])
    with pytest.raises(TimelineInputError, match="seq 1 after seq 2"):
        timelines.feed(conv.rows[0])


# -- tables -----------------------------------------------------------------------------------------

def test_records_fit_the_schemas_and_tables_are_deterministic():
    derived = {"date", "ts", "settle_ts", "open_ts", "end_ts"}
    for record_type, table_schema in ((Delivery, schema.DELIVERIES), (Publish, schema.PUBLISHES),
                                      (ChannelFacts, CHANNELS), (Violation, VIOLATIONS)):
        assert list(record_type.__slots__) == [n for n in table_schema.names if n not in derived]
    first, second = Conv("a"), Conv("b")
    _busy(first)
    _busy(second, ch=2)
    test_rows = sorted(first.rows + second.rows, key=lambda x: (x["connection_id"], x["seq"]))
    tables = to_tables(replay(test_rows))
    shuffled = list(replay(test_rows))
    random.Random(7).shuffle(shuffled)
    assert to_tables(shuffled) == tables
    interleaved = sorted(first.rows + second.rows, key=lambda x: (x["seq"], x["connection_id"]))
    assert to_tables(replay(interleaved)) == tables  # connections may interleave; each stays in seq order
    for name, table_schema in (("deliveries", schema.DELIVERIES), ("publishes", schema.PUBLISHES),
                               ("channels", CHANNELS), ("violations", VIOLATIONS)):
        assert tables[name].schema == table_schema
    deliveries = tables["deliveries"].to_pylist()
    assert deliveries[0]["date"] == "2026-11-18" and deliveries[0]["settle_ts"] is not None


# -- the recorded lab examples -------------------------------------------------------------------------

CASES = {"double ack": "double_ack", "never delivered": "unknown_tag", "ack on another channel": "wrong_channel"}


def _example(capture):
    parts = []
    _, connections = decode(capture, parts.append)
    with open(capture.replace(".pcapng", ".expected.json")) as f:
        expected = json.load(f)
    by_port = {port: name for name, port in expected["facts"]["connections"].items()}
    names = {c["connection_id"]: c["connection_name"] or by_port.get(c["client_port"]) for c in connections}
    tables = replay_frames(pa.concat_tables(parts))
    rows = {name: table.to_pylist() for name, table in tables.items()}
    for table_rows in rows.values():
        for row in table_rows:
            row["connection_name"] = names[row["connection_id"]]
    return expected, rows


def _counted(kind, rows):
    """Our rows that make up what the lab counts for `kind`, by (connection_name, channel)."""
    publishes, deliveries = rows["publishes"], rows["deliveries"]
    if kind == "lost_confirm":
        chosen = [p for p in publishes if p["mode"] == "confirm" and p["outcome"] == "lost"]
    elif kind == "confirm_nack":
        chosen = [p for p in publishes if p["outcome"] == "nacked"]
    elif kind == "out_of_order_confirm":
        chosen = [p for p in publishes if p["out_of_order"]]
    elif kind == "unroutable_returned":
        chosen = [p for p in publishes if p["return_code"] is not None]
    elif kind == "unconfirmed_persistent_publish":
        chosen = [p for p in publishes if p["mode"] == "none" and p["persistent"]]
    elif kind == "unknown_delivery_tag":
        chosen = rows["violations"]
    elif kind == "redelivery_after_close":
        redelivered = [d for d in deliveries if d["redelivered"]]
        chosen = [d for d in deliveries if d["outcome"] in ("channel_closed", "connection_closed")
                  and any(r["message_identity"] == d["message_identity"] and r["ts_ns"] > d["settle_ts_ns"]
                          for r in redelivered)]
    else:
        return None
    return Counter((x["connection_name"], x["channel"]) for x in chosen)


@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_example_expectations_about_deliveries_and_publishes(capture):
    expected, rows = _example(capture)
    for entry in expected["expect"]:
        counted = _counted(entry["kind"], rows)
        if counted is not None:
            assert counted[(entry["connection_name"], entry["channel"])] == entry["observed_count"], entry
    for kind in expected["forbid"]:
        assert not _counted(kind, rows), kind
    if "unbounded_prefetch" in expected["forbid"]:
        assert sum(c["unbounded_manual_consumes"] for c in rows["channels"]) == 0
    if "unknown_delivery_tag" in expected["forbid"]:
        assert rows["violations"] == []
    if expected["scenario"] != "mid_stream":  # every channel opened inside these captures
        assert not [x for x in rows["deliveries"] + rows["publishes"] if x["outcome"] == "unknown"]
        assert all(c["history_known"] for c in rows["channels"])


def test_example_facts():
    facts = {}
    for capture in EXAMPLES:
        expected, rows = _example(capture)
        facts[expected["scenario"]] = (expected, rows)

    expected, rows = facts["unknown_delivery_tag"]
    by_channel = {e["channel"]: CASES[e["case"]] for e in expected["expect"]}
    assert {v["channel"]: v["kind"] for v in rows["violations"]} == by_channel
    assert all(v["broker_reply_code"] == 406 and v["evidence"] == "capture" for v in rows["violations"])
    assert [v["delivered_channel"] for v in rows["violations"] if v["kind"] == "wrong_channel"] == [3]

    expected, rows = facts["lost_confirms"]
    lost = Counter(p["connection_name"] for p in rows["publishes"] if p["outcome"] == "lost")
    assert lost == {"lab-lost_confirms-tcp-cut": 30, "lab-lost_confirms-broker-closed": 10}
    assert Counter(p["connection_name"] for p in rows["publishes"]) == expected["facts"]["publishes"]

    expected, rows = facts["confirm_nacks"]
    assert Counter(p["outcome"] for p in rows["publishes"]) == {"nacked": expected["facts"]["nack_frames"],
                                                                 "acked": 5}

    expected, rows = facts["out_of_order_confirms"]
    first = min((p for p in rows["publishes"] if p["out_of_order"]), key=lambda p: p["settle_seq"])
    assert first["confirm_tag"] == expected["facts"]["first_overtaking_ack_tag"]
    assert {p["outcome"] for p in rows["publishes"]} == {"acked"} and len(rows["publishes"]) == 40

    expected, rows = facts["clean_async_confirms"]
    assert Counter(p["outcome"] for p in rows["publishes"]) == {"acked": expected["facts"]["publishes"]}
    assert Counter(d["outcome"] for d in rows["deliveries"]) == {"ack": expected["facts"]["publishes"]}
    assert not any(p["out_of_order"] for p in rows["publishes"])

    expected, rows = facts["mid_stream"]
    assert rows["violations"] == [] and not [x for x in rows["publishes"] + rows["deliveries"] if x["outcome"] == "lost"]
    assert len(rows["deliveries"]) == expected["facts"]["deliveries"]
    assert min(d["delivery_tag"] for d in rows["deliveries"]) == expected["facts"]["first_delivery_tag"]
    assert {p["outcome"] for p in rows["publishes"]} == {"unknown"}
    assert {d["outcome"] for d in rows["deliveries"]} == {"ack", "open"}  # still busy when the recording stopped

    expected, rows = facts["channel_reuse"]
    assert [c["confirm_mode"] for c in rows["channels"]] == expected["facts"]["confirm_mode"]
    assert [c["incarnation"] for c in rows["channels"]] == [1, 2, expected["facts"]["incarnations"]]
    assert Counter((p["incarnation"], p["confirm_seq"]) for p in rows["publishes"] if p["confirm_seq"]) == \
        {(1, 1): 1, (1, 2): 1, (1, 3): 1, (1, 4): 1, (1, 5): 1, (2, 1): 1, (2, 2): 1, (2, 3): 1}

    expected, rows = facts["transactions"]
    outcomes = Counter(p["outcome"] for p in rows["publishes"])
    assert outcomes == {"committed": expected["facts"]["committed_publishes"],
                        "rolled_back": expected["facts"]["rolled_back_publishes"]}
    assert {(d["outcome"], d["in_tx"], d["settled_by_multiple"]) for d in rows["deliveries"]} == {("ack", True, True)}

    expected, rows = facts["redelivery_after_close"]
    first = [d for d in rows["deliveries"] if d["connection_name"] == "lab-redelivery_after_close-first-consumer"]
    assert Counter(d["outcome"] for d in first) == {"ack": expected["facts"]["acked_before_close"],
                                                    "channel_closed": 7}

    expected, rows = facts["requeue_loop"]
    for entry in expected["expect"]:
        bounced = [d for d in rows["deliveries"] if d["message_id"] == entry["message_id"]
                   and d["outcome"] in ("nack", "reject")]
        assert len(bounced) == entry["observed_count"] - 1

    expected, rows = facts["unroutable_mandatory"]
    assert Counter((p["outcome"], p["return_code"]) for p in rows["publishes"]) == \
        {("acked", 312): expected["facts"]["unroutable_publishes"]}


# -- random valid traffic ------------------------------------------------------------------------------

class ValidTraffic:
    """Drives one connection the way a correct client and broker would, and knows what became of
    every delivery and publish (by message id): the timelines must agree, with no violation."""

    def __init__(self, draw, transactions=True):
        self.draw, self.conv, self.transactions = draw, Conv(), transactions
        self.channels: dict[int, dict] = {}
        self.incarnations: Counter = Counter()
        self.deliveries: dict[str, str] = {}   # message id -> expected outcome
        self.delivery_keys: dict[str, tuple] = {}  # message id -> (channel, incarnation, tag)
        self.publishes: dict[str, str] = {}
        self.n = 0

    def step(self):
        ch = self.draw(st.integers(1, 3))
        state = self.channels.get(ch)
        if state is None:
            self.conv.open(ch)
            self.incarnations[ch] += 1
            self.channels[ch] = {"inc": self.incarnations[ch], "tag": 0, "outstanding": {}, "tx": False,
                                 "tx_acks": [], "tx_pubs": [], "confirm": False, "pending": {}, "published": 0,
                                 "consumers": {}}
            return
        actions = ["consume", "deliver", "get", "settle", "settle", "publish", "publish", "confirm", "close",
                   "recover", "qos", "heartbeat"]
        if not state["tx"] and not state["confirm"]:
            actions += ["confirm.select"] + (["tx.select"] if self.transactions else [])
        if state["tx"]:
            actions += ["tx.commit", "tx.rollback"]
        getattr(self, "do_" + self.draw(st.sampled_from(actions)).replace(".", "_"))(ch, state)

    def _message(self, prefix):
        self.n += 1
        return f"{prefix}{self.n}"

    def do_heartbeat(self, ch, state):
        self.conv.c(0, "heartbeat")

    def do_qos(self, ch, state):
        self.conv.c(ch, "basic.qos", prefetch_count=self.draw(st.integers(0, 300)),
                    prefetch_global=self.draw(st.booleans()))

    def do_consume(self, ch, state):
        ctag = f"c{len(state['consumers'])}"
        state["consumers"][ctag] = self.draw(st.booleans())
        self.conv.consume(ch, tag=ctag, no_ack=state["consumers"][ctag])

    def _delivered(self, ch, state, no_ack):
        state["tag"] += 1
        msg = self._message("d")
        self.delivery_keys[msg] = (ch, state["inc"], state["tag"])
        self.deliveries[msg] = "auto" if no_ack else "open"
        if not no_ack:
            state["outstanding"][state["tag"]] = msg
        return state["tag"], msg

    def do_deliver(self, ch, state):
        if state["consumers"]:
            ctag = self.draw(st.sampled_from(sorted(state["consumers"])))
            tag, msg = self._delivered(ch, state, state["consumers"][ctag])
            self.conv.deliver(ch, tag, ctag=ctag, msg=msg)

    def do_get(self, ch, state):
        no_ack = self.draw(st.booleans())
        self.conv.c(ch, "basic.get", queue="q", no_ack=no_ack)
        if self.draw(st.booleans()):
            self.conv.b(ch, "basic.get-empty")
        else:
            tag, msg = self._delivered(ch, state, no_ack)
            self.conv.b(ch, "basic.get-ok", delivery_tag=tag, exchange="", routing_key="q", redelivered=False,
                        message_id=msg, message_identity="id:" + msg)

    def do_settle(self, ch, state):
        outstanding = state["outstanding"]
        method = self.draw(st.sampled_from(["basic.ack", "basic.nack", "basic.reject"]))
        multiple = method != "basic.reject" and self.draw(st.booleans())
        if multiple and (not outstanding or self.draw(st.integers(0, 4)) == 0):
            tag, settled = 0, list(outstanding)
        elif outstanding:
            tag = self.draw(st.sampled_from(sorted(outstanding)))
            settled = [t for t in outstanding if t <= tag] if multiple else [tag]
        else:
            return
        self.conv.ack(ch, tag, multiple=multiple, method=method, requeue=self.draw(st.booleans()))
        outcome = {"basic.ack": "ack", "basic.nack": "nack", "basic.reject": "reject"}[method]
        for t in settled:
            msg = outstanding.pop(t)
            if state["tx"]:
                state["tx_acks"].append((t, msg, outcome))
            else:
                self.deliveries[msg] = outcome

    def do_recover(self, ch, state):
        self.conv.c(ch, self.draw(st.sampled_from(["basic.recover", "basic.recover-async"])), requeue=True)
        for msg in state["outstanding"].values():
            self.deliveries[msg] = "recovered"
        state["outstanding"] = {}

    def do_publish(self, ch, state):
        msg = self._message("p")
        mandatory = self.draw(st.booleans())
        seq = self.conv.publish(ch, msg, mandatory=mandatory)
        if state["confirm"]:
            state["published"] += 1
            state["pending"][state["published"]] = msg
            self.conv.rows[seq - 1]["_confirm_number"] = state["published"]  # for reordering; ignored by the model
            self.publishes[msg] = "open"
        elif state["tx"]:
            state["tx_pubs"].append(msg)
            self.publishes[msg] = "open"
        else:
            self.publishes[msg] = "untracked"
        if mandatory and self.draw(st.booleans()):  # unroutable: the broker returns it
            self.conv.b(ch, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="q",
                        message_id=msg, message_identity="id:" + msg)

    def do_confirm(self, ch, state):
        pending = state["pending"]
        if not pending:
            return
        number = self.draw(st.sampled_from(sorted(pending)))
        multiple, nack = self.draw(st.booleans()), self.draw(st.integers(0, 5)) == 0
        self.conv.confirm(ch, number, multiple=multiple, nack=nack)
        for n in [n for n in pending if n <= number] if multiple else [number]:
            self.publishes[pending.pop(n)] = "nacked" if nack else "acked"

    def do_confirm_select(self, ch, state):
        self.conv.c(ch, "confirm.select", nowait=False)
        self.conv.b(ch, "confirm.select-ok")
        state["confirm"] = True

    def do_tx_select(self, ch, state):
        self.conv.c(ch, "tx.select")
        self.conv.b(ch, "tx.select-ok")
        state["tx"] = True

    def do_tx_commit(self, ch, state):
        self.conv.c(ch, "tx.commit")
        self.conv.b(ch, "tx.commit-ok")
        for _, msg, outcome in state["tx_acks"]:
            self.deliveries[msg] = outcome
        for msg in state["tx_pubs"]:
            self.publishes[msg] = "committed"
        state["tx_acks"], state["tx_pubs"] = [], []

    def do_tx_rollback(self, ch, state):
        self.conv.c(ch, "tx.rollback")
        self.conv.b(ch, "tx.rollback-ok")
        for tag, msg, _ in state["tx_acks"]:
            state["outstanding"][tag] = msg
        state["outstanding"] = dict(sorted(state["outstanding"].items()))
        for msg in state["tx_pubs"]:
            self.publishes[msg] = "rolled_back"
        state["tx_acks"], state["tx_pubs"] = [], []

    def _ended(self, state, delivery_outcome):
        for msg in list(state["outstanding"].values()) + [msg for _, msg, _ in state["tx_acks"]]:
            self.deliveries[msg] = delivery_outcome
        for msg in list(state["pending"].values()) + state["tx_pubs"]:
            self.publishes[msg] = "lost"

    def do_close(self, ch, state):
        self.conv.close(ch, by=self.draw(st.sampled_from(["client", "broker"])))
        self._ended(state, "channel_closed")
        del self.channels[ch]

    def end(self):
        how = self.draw(st.sampled_from(["connection.close", "tcp.fin", "tcp.rst", "end of data"]))
        if how == "connection.close":
            self.conv.c(0, how, reply_code=200)
            self.conv.b(0, "connection.close-ok")
        elif how != "end of data":
            self.conv.c(0, how)
        if how != "end of data":
            for state in self.channels.values():
                self._ended(state, "connection_closed")


def valid_traffic(data, transactions=True) -> ValidTraffic:
    traffic = ValidTraffic(data.draw, transactions)
    for _ in range(data.draw(st.integers(1, 60), label="steps")):
        traffic.step()
    traffic.end()
    return traffic


def renumbered(rows):
    """Rows in this order, with seq and ts_ns renumbered by position as the decoder would."""
    return [dict(row, seq=i + 1, ts_ns=T0 + (i + 1) * 1_000_000) for i, row in enumerate(rows)]


def outcomes_by_message(records):
    deliveries = {d.message_id: d.outcome for d in records if isinstance(d, Delivery)}
    publishes = {p.message_id: p.outcome for p in records if isinstance(p, Publish)}
    return deliveries, publishes


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.data())
def test_random_valid_traffic_settles_everything_once_without_violations(data):
    traffic = valid_traffic(data)
    result = run(traffic.conv)
    assert result.violations == []
    assert {traffic.delivery_keys[d.message_id]: d.outcome for d in result.deliveries} == \
        {traffic.delivery_keys[m]: o for m, o in traffic.deliveries.items()}
    assert outcomes_by_message(result.records) == (traffic.deliveries, traffic.publishes)
    assert len(result.channels) == sum(traffic.incarnations.values())
    tables = to_tables(result.records)
    assert [tables[name].num_rows for name in ("deliveries", "publishes", "channels", "violations")] == \
        [len(traffic.deliveries), len(traffic.publishes), len(result.channels), 0]


def _swappable(first, second) -> bool:
    """An ack right after the delivery it names, or a confirm right after the publish it names:
    a capture may show them the other way round."""
    if first["channel"] != second["channel"] or second.get("delivery_tag") in (None, 0):
        return False
    if first["method"] in ("basic.deliver", "basic.get-ok"):
        return second["direction"] == "to_broker" and second["delivery_tag"] == first["delivery_tag"]
    return (first.get("_confirm_number") is not None and second["direction"] == "to_client"
            and second["method"] in ("basic.ack", "basic.nack") and second["delivery_tag"] == first["_confirm_number"])


@SETTINGS
@given(st.data())
def test_acks_and_confirms_shown_before_their_frame_change_nothing(data):
    traffic = valid_traffic(data)
    rows, i = list(traffic.conv.rows), 0
    while i < len(rows) - 1:
        if _swappable(rows[i], rows[i + 1]) and data.draw(st.booleans()):
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
            i += 1
        i += 1
    records = replay(renumbered(rows))
    assert not [x for x in records if isinstance(x, Violation)]
    assert outcomes_by_message(records) == (traffic.deliveries, traffic.publishes)


def _known_or_unknown(records, traffic):
    """Every delivery and publish in the data comes out once, as the traffic says or unknown."""
    assert not [x for x in records if isinstance(x, Violation)]
    deliveries, publishes = outcomes_by_message(records)
    for got, expected in ((deliveries, traffic.deliveries), (publishes, traffic.publishes)):
        wrong = {m: (o, expected[m]) for m, o in got.items() if o not in (expected[m], "unknown")}
        assert not wrong, wrong


@SETTINGS
@given(st.data())
def test_a_capture_starting_mid_stream_flags_nothing_and_guesses_nothing(data):
    # A transaction begun before the capture and rolled back inside it is a known blind spot: acks
    # before the rollback are taken at face value (see analyzer.timeline), so no tx.select here.
    traffic = valid_traffic(data, transactions=False)
    rows = traffic.conv.rows
    cut = data.draw(st.integers(1, len(rows)), label="cut")
    head = [{"connection_id": traffic.conv.id, "direction": d, "channel": 0, "method": "capture.midstream"}
            for d in ("to_client", "to_broker")]
    records = replay(renumbered(head + rows[cut:]))
    _known_or_unknown(records, traffic)
    seen = {row["message_id"] for row in rows[cut:]
            if row["method"] in ("basic.publish", "basic.deliver", "basic.get-ok")}
    assert set(outcomes_by_message(records)[0]) | set(outcomes_by_message(records)[1]) == seen


@SETTINGS
@given(st.data())
def test_bytes_lost_in_one_direction_make_things_unknown_never_wrong(data):
    traffic = valid_traffic(data)
    rows = traffic.conv.rows
    direction = data.draw(st.sampled_from(["to_broker", "to_client"]), label="direction")
    start = data.draw(st.integers(1, len(rows)), label="start")
    end = data.draw(st.integers(start, min(len(rows), start + 12)), label="end")
    dropped = [i for i in range(start, end) if rows[i]["direction"] == direction
               and not rows[i]["method"].startswith("tcp.")] if start < len(rows) else []
    kept = [row for i, row in enumerate(rows) if i not in set(dropped)]
    if dropped:  # the decoder reports the hole just before the next bytes of that direction
        after = next((i for i, row in enumerate(kept) if rows.index(row) > dropped[-1]
                      and row["direction"] == direction), len(kept))
        kept.insert(after, {"connection_id": traffic.conv.id, "direction": direction, "channel": 0,
                            "method": "capture.gap", "gap_bytes": 100})
    _known_or_unknown(replay(renumbered(kept)), traffic)
