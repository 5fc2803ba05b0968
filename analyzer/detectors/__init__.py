"""The findings about one connection, sans-IO: its timeline records and a few of its frames in,
rows of schema.FINDINGS (dicts) out. The per-connection pass runs it beside the state machine
(DESIGN.md, "Analysis"); requeue_loop and redelivery_after_close follow a message across
connections (messages.py: each message's deliveries in, gathered by Spark afterwards).

    detectors = ConnectionDetectors(connection_row, thresholds)
    for row in frames:                       # in seq order
        if wants_frame(row):                 # FRAME_COLUMNS of the few rows some kinds read
            detectors.frame(row)
        for record in timelines.feed(row):   # Delivery, Publish, ChannelFacts, Violation, any order
            detectors.record(record)
    ...
    findings = detectors.findings(packets_of)  # packets_of(seqs) -> [(source_packet, source) | None]

Modules: publisher.py (confirm-side kinds and unroutable_returned), consumer.py (ack-side kinds
and unbounded_prefetch), flow.py (flow control), context.py (what is known at the connection's
end, frames placed in incarnations), common.py (the raw finding, evidence, `finish`), messages.py
(the two kinds across connections).

Memory: every kind keeps running aggregates (counts, spans, the first MAX_EVIDENCE items).
unacked_buildup (its profile over time, profile.py) and synchronous_confirms (the idle times,
quantiles.py) read their records in seq order while records come out when final, so each keeps the
records' events beyond the horizon the caller last gave (`fold`) until they can be folded in: few,
unless one delivery or publish stays open for long. The frame-based kinds keep one tuple per
basic.return, manual basic.consume and flow-control frame, and the context one ChannelFacts per
ended incarnation: the incarnations frames belong to are known once their ChannelFacts are in.
README "Findings" defines the kinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .. import folds
from ..timeline import records as r
from .common import MAX_EVIDENCE, Firsts, PACKET_COLUMNS, SEVERITY, PacketsOf, RawFinding, finish
from .consumer import UnackedBuildup, UnboundedPrefetch, UnknownDeliveryTag
from .context import Context
from .flow import FlowBlocked
from .publisher import (ConfirmNack, LostConfirm, OutOfOrderConfirm, SynchronousConfirms,
                        UnconfirmedPersistentPublish, UnroutableReturned, _Lockstep)

# The kinds decided here, in schema.FINDING_KINDS order.
KINDS = ("lost_confirm", "confirm_nack", "out_of_order_confirm", "unacked_buildup", "unknown_delivery_tag",
         "unroutable_returned", "unconfirmed_persistent_publish", "synchronous_confirms", "unbounded_prefetch",
         "flow_blocked")

# The frames columns `frame` reads, of the rows `wants_frame` picks.
FRAME_COLUMNS = ("seq", "ts_ns", "agent_id", "direction", "channel", "method", "no_ack", "queue", "reply_code",
                 "reply_text", "exchange", "routing_key", "message_identity", "active", "detail")
# The schema.CONNECTIONS columns `finish` and flow_blocked read.
CONNECTION_COLUMNS = ("connection_id", "connection_name", "client_addr", "client_port", "server_addr", "server_port",
                      "source", "last_ts_ns")


# The methods of those rows: one set lookup rules out nearly every frame of a connection.
FRAME_METHODS = frozenset(("basic.return", "basic.consume", "connection.blocked", "connection.unblocked",
                           "channel.flow"))


def wants_frame(row: Mapping) -> bool:
    """The frame rows some kind reads: basic.return, channel.flow, connection.blocked and
    connection.unblocked to the client, manual-ack basic.consume to the broker."""
    return row["method"] in FRAME_METHODS and (
        UnroutableReturned.wants(row) or UnboundedPrefetch.wants(row) or FlowBlocked.wants(row))


class ConnectionDetectors:
    """One connection's detectors, fed as the pass goes and asked for findings at its end."""

    def __init__(self, connection: Mapping, thresholds):
        self.context = Context(dict(connection), thresholds)
        self.lost, self.nacked = LostConfirm(), ConfirmNack()
        self.out_of_order, self.persistent = OutOfOrderConfirm(), UnconfirmedPersistentPublish()
        self.synchronous, self.returned = SynchronousConfirms(), UnroutableReturned()
        self.buildup, self.unbounded = UnackedBuildup(thresholds), UnboundedPrefetch()
        self.violations, self.flow = UnknownDeliveryTag(), FlowBlocked()
        self.rewired()

    def rewired(self) -> None:
        """After the detectors were set anew (state.py resumes them)."""
        self._by_publish = (self.lost, self.nacked, self.out_of_order, self.persistent, self.synchronous)

    def record(self, record) -> None:
        kind = type(record)
        if kind is r.Delivery:  # the commonest record first
            self.buildup.add(record)
        elif kind is r.Publish:
            if _publish_in_c is None or not _publish_in_c(self.synchronous, record):
                self.python_publish(record)
        elif kind is r.ChannelFacts:
            self.context.channels[(record.channel, record.incarnation)] = record
        elif kind is r.Violation:
            self.violations.add(record)
        else:
            raise TypeError(f"not a timeline record: {record!r}")

    def python_publish(self, p: r.Publish) -> None:
        """One publish through every publish kind, the rules' one statement (the C twin, which takes
        the publishes only synchronous_confirms counts, is held to it)."""
        for detector in self._by_publish:
            detector.add(p)

    def frame(self, row: Mapping) -> None:
        """A frame row `wants_frame` picked (others are ignored), with FRAME_COLUMNS."""
        for detector in (self.returned, self.unbounded, self.flow):
            if detector.wants(row):
                detector.frame(row)

    def fold(self, delivery_horizon: int | None, publish_horizon: int | None) -> None:
        """No delivery (publish) record still to come has a seq below `delivery_horizon`
        (`publish_horizon`; None: no more records): the kinds that keep events in seq order
        (unacked_buildup, synchronous_confirms) fold what is complete into running state.
        timeline/metrics_stream.py's `item_horizons` reads both off the state machine."""
        self.buildup.fold(delivery_horizon)
        self.synchronous.fold(publish_horizon)

    def raw_findings(self) -> list[RawFinding]:
        """The findings, from everything fed so far. It folds what was pending: the end of this
        object's life (take its state, detectors/state.py, before)."""
        raw = []
        for detector in (self.lost, self.nacked, self.out_of_order, self.buildup, self.violations, self.returned,
                         self.persistent, self.synchronous, self.unbounded, self.flow):
            raw += detector.findings(self.context)
        return raw

    def findings(self, packets_of: PacketsOf) -> list[dict]:
        """Rows of schema.FINDINGS. `packets_of(seqs)`: the (source_packet, source) of each frame
        seq of this connection asked for (PACKET_COLUMNS), None for a seq the frames lack. In two
        steps, for a caller that looks the packets up later: `raw_findings()`, `evidence_seqs(raw)`
        and `common.finish(raw, connection, packets_of)`."""
        return [finish(raw, self.context.connection, packets_of) for raw in self.raw_findings()]


# `python_publish` in C, for the publishes it takes (None: not built, or switched off).
_publish_in_c = folds.publish_fold(SynchronousConfirms, _Lockstep, Firsts, MAX_EVIDENCE)


def evidence_seqs(raw: list[RawFinding]) -> list[int]:
    """The frame seqs the raw findings of one connection point at, each once, ascending: what
    `packets_of` will be asked for. The pass sees each frame once and these are known only at the
    connection's end, so a caller that did not keep the frames looks them up afterwards (the
    findings step's scan of `frames` for these few seqs: spark_jobs/findings.py)."""
    return sorted({seq for finding in raw for seq in finding.evidence.get("seqs") or () if seq is not None})


def detect_connection(records: Iterable, frames: Iterable[Mapping], connection: Mapping, thresholds,
                      packets_of: PacketsOf) -> list[dict]:
    """Every per-connection finding of one connection: its records (any order), its frame rows
    (any of them, in seq order; only those `wants_frame` picks are read) and its CONNECTIONS row."""
    detectors = ConnectionDetectors(connection, thresholds)
    for row in frames:
        if wants_frame(row):
            detectors.frame(row)
    for record in records:
        detectors.record(record)
    return detectors.findings(packets_of)


__all__ = ["ConnectionDetectors", "detect_connection", "evidence_seqs", "finish", "wants_frame", "KINDS",
           "FRAME_METHODS", "FRAME_COLUMNS", "PACKET_COLUMNS", "CONNECTION_COLUMNS", "SEVERITY", "MAX_EVIDENCE",
           "RawFinding"]
