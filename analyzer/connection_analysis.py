"""One connection analysed whole, sans-IO: its frame rows in (seq order), and out, as they become
final, everything the analysis keeps about it: the timeline records (deliveries, publishes,
channels, violations), its channel_metrics rows, its findings and the checkpoint the next
incremental run carries it on from. What the Spark pass runs for each connection
(spark_jobs/connection_pass.py), so every per-connection rule lives once, here and in the modules
it drives:

    analysis = ConnectionAnalysis(connection_id, agent_id, settings, records.append, metrics.append)
    for row in rows:                  # schema.FRAMES columns (ANALYSIS_COLUMNS at least)
        analysis.feed(row)
    done = analysis.finish(connection_row)   # raw findings, checkpoint

and an incremental run carries a connection on from that checkpoint, its timeline, channel_metrics
and detectors (`CarriedAnalysis`, streamed the same way), reading only its new frames.

A connection of millions of frames streams: records and metric rows leave as they become final;
what stays is what the machine still holds, the checkpoint's boundary records and the detectors'
running state (analyzer/detectors: folded as the machine's horizon moves on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from . import folds
from .detectors import FRAME_COLUMNS, ConnectionDetectors, RawFinding, wants_frame
from .detectors.state import from_state, to_state
from .timeline import INPUT_COLUMNS
from .timeline.carry import Checkpoint, ResumedConnection, StateError, WholeConnection
from .timeline.connection import ConnectionTimeline
from .timeline.metrics import ChannelMetrics, HorizonError
from .timeline.metrics_stream import announce_opens, horizons, item_horizons

# The frames columns one connection's analysis reads.
ANALYSIS_COLUMNS = tuple(dict.fromkeys((*INPUT_COLUMNS, *FRAME_COLUMNS)))
# Rows between two looks at what the machine holds (to let finished metric buckets out): reading it
# walks every open item, so not at every row.
ADVANCE_EVERY_ROWS = 4096


@dataclass(frozen=True)
class Settings:
    """What a run fixes for every connection: the metrics' bucket, the overdue timeout and the
    detectors' thresholds (analyzer/detectors/thresholds.py)."""
    bucket_seconds: int
    overdue_ns: int
    thresholds: object

    @property
    def bucket_ns(self) -> int:
        return self.bucket_seconds * 1_000_000_000


@dataclass
class Analysed:
    raw_findings: list[RawFinding]
    checkpoint: Checkpoint | None          # None: the connection ended, or see `no_checkpoint`
    no_checkpoint: str | None
    metrics_redo: str | None               # why its channel_metrics must be computed from all its records


class ConnectionAnalysis:
    # Slotted: the C hand-off (end of module) reads out_record, detectors and metrics per record.
    __slots__ = ("out_record", "out_metrics", "advance_every", "out_open_record", "whole", "metrics", "detectors",
                 "metrics_redo", "rows")

    def __init__(self, connection_id: str, agent_id: str | None, settings: Settings,
                 out_record: Callable, out_metrics: Callable[[list[dict]], None],
                 advance_every: int = ADVANCE_EVERY_ROWS, out_open_record: Callable | None = None):
        """`out_open_record`: where the records of what is still open when the data ends go (the
        checkpoint's provisional ones: the next run replaces them); by default `out_record`."""
        self.out_record, self.out_metrics, self.advance_every = out_record, out_metrics, advance_every
        self.out_open_record = out_open_record or out_record
        self.whole = self._machine(connection_id, agent_id, settings)
        if _hand_off is not None and _hands_off(self, self.whole):
            self.whole.timeline.emit = _hand_off(self, self.whole)
        self.metrics: ChannelMetrics | None = ChannelMetrics(settings.bucket_seconds)
        self.detectors = ConnectionDetectors({"connection_id": connection_id}, settings.thresholds)
        self.metrics_redo: str | None = None
        self.rows = 0

    def _machine(self, connection_id: str, agent_id: str | None, settings: Settings) -> WholeConnection:
        return WholeConnection(connection_id, agent_id, self._record, settings.bucket_ns, settings.overdue_ns)

    @property
    def connection_id(self) -> str:
        return self.whole.timeline.id

    def _record(self, record) -> None:
        """One record: out, to the detectors and to channel_metrics (`whole.out`; with the machine's
        `_emit`, what the C hand-off does in one call, tests/test_folds.py holding the two together)."""
        self.out_record(record)
        self.detectors.record(record)
        self._metrics_record(record)

    def _metrics_record(self, record) -> None:
        """channel_metrics' part of `_record` (the C hand-off's way where its twin declines)."""
        if self.metrics is not None:
            try:
                self.metrics.record(record)
            except HorizonError as error:
                self._give_up_metrics(error)

    def feed(self, row: Mapping) -> None:
        if wants_frame(row):
            self.detectors.frame(row)
        self.whole.feed(row)
        self.rows += 1
        if self.rows % self.advance_every == 0:
            self._advance()

    def feed_from(self, rows: list, at: int, stop: int) -> int:
        """`feed(rows[at])`, then the rows after it up to `stop` while they are plain frames of this
        connection, with no Python call per row (ConnectionTimeline.feed_plain): exactly `feed` on
        each. The index of the first row not fed."""
        self.feed(rows[at])
        at += 1
        while at < stop:
            boundary = min(stop, at + self.advance_every - self.rows % self.advance_every)
            done = self.whole.feed_plain(rows, at, boundary)
            if done == at:
                break
            self.rows += done - at
            at = done
            if self.rows % self.advance_every == 0:
                self._advance()
        return at

    def _advance(self) -> None:
        """Let out what became final: the detectors' folds and channel_metrics' finished buckets."""
        self.detectors.fold(*item_horizons(self.whole.timeline))
        if self.metrics is not None:
            try:
                announce_opens(self.metrics, self.whole.timeline)
                self.out_metrics(self.metrics.advance(*horizons(self.whole.timeline)))
            except HorizonError as error:
                self._give_up_metrics(error)

    def _give_up_metrics(self, error: HorizonError) -> None:
        """Frame times went back past a bucket already let out: the streamed rows cannot be mended
        here, so the caller computes this connection's metrics again from all its records."""
        self.metrics, self.metrics_redo = None, str(error)

    def finish(self, connection: Mapping) -> Analysed:
        """The data ends. `connection`: its schema.CONNECTIONS row (just its connection_id when the
        table lacks it)."""
        taken = []

        def before_open() -> None:
            taken.append(detectors_state(self.detectors, self.whole.timeline))
            self.out_record = self.out_open_record

        checkpoint = self.whole.finish(before_open=before_open)
        if checkpoint is not None:
            checkpoint.detectors = taken[0]
        if self.metrics is not None:
            self.out_metrics(self.metrics.finish())
        return Analysed(findings_of(self.detectors, connection), checkpoint, self.whole.no_checkpoint,
                        self.metrics_redo)


# Each record of a ConnectionAnalysis's timeline through `_record` and WholeConnection._emit in one
# C call, the folds' C twins called directly, instead of four Python calls (None: not built, or off).
_hand_off = folds.hand_off(ConnectionAnalysis, WholeConnection, ConnectionDetectors)


def _hands_off(analysis: ConnectionAnalysis, whole: WholeConnection) -> bool:
    """Whether the C hand-off does what `whole._emit` does: a subclass may hand records on otherwise."""
    return (type(analysis)._record is ConnectionAnalysis._record and type(whole)._emit is WholeConnection._emit
            and whole.out == analysis._record)


class CarriedAnalysis(ConnectionAnalysis):
    """One connection carried on from its checkpoint (None: new to this run), streamed as
    ConnectionAnalysis streams one analysed whole: its timeline (carry.ResumedConnection), its
    channel_metrics from the boundary bucket on (the buckets before are stored and final), and its
    detectors resumed from the checkpoint's state. `fallback` says why it cannot be carried: the
    caller then analyses it whole and drops whatever came out of it here; `refused` is why the
    caller could not read its checkpoint (then none of its rows is read).

        analysis = CarriedAnalysis(checkpoint, connection_id, agent_id, settings, records.append, metrics.extend)
        for row in new_rows:
            analysis.feed(row)
        done = analysis.finish(connection_row)   # Carried: fallback, stale records, touched incarnations..."""

    def __init__(self, checkpoint: Checkpoint | None, connection_id: str, agent_id: str | None, settings: Settings,
                 out_record: Callable, out_metrics: Callable[[list[dict]], None],
                 advance_every: int = ADVANCE_EVERY_ROWS, out_open_record: Callable | None = None,
                 refused: str | None = None):
        self.checkpoint = checkpoint
        super().__init__(connection_id, agent_id, settings, out_record, self._from_boundary, advance_every,
                         out_open_record)
        self.out_stored_metrics = out_metrics
        self.fallback: str | None = refused
        if checkpoint is not None:
            self.metrics.feed(self.whole.kept)  # the boundary's records: its buckets are computed again
            if checkpoint.detectors is None:
                self.fallback = "its checkpoint holds no detectors' state"
            else:
                try:
                    self.detectors = from_state(checkpoint.detectors, {"connection_id": connection_id},
                                                settings.thresholds)
                except StateError as refused:
                    self.fallback = f"detectors' state refused: {refused}"

    def _machine(self, connection_id: str, agent_id: str | None, settings: Settings) -> ResumedConnection:
        return ResumedConnection(self.checkpoint, connection_id, agent_id, self._record, settings.bucket_ns,
                                 settings.overdue_ns)

    def _from_boundary(self, rows: list[dict]) -> None:
        boundary_ns = self.whole.boundary_ns
        self.out_stored_metrics(rows if boundary_ns is None else
                                [row for row in rows if row["bucket_start_ns"] >= boundary_ns])

    def _give_up_metrics(self, error: HorizonError) -> None:
        # The stored buckets before the boundary are final: nothing to compute them again from here.
        self.metrics, self.fallback = None, f"channel_metrics: {error}"

    def feed(self, row: Mapping) -> None:
        if self.fallback is None:
            super().feed(row)
            self.fallback = self.fallback or self.whole.fallback

    def feed_from(self, rows: list, at: int, stop: int) -> int:
        """ConnectionAnalysis.feed_from, its plain frames bounded by ResumedConnection's checks
        (WholeConnection.feed_plain); once it fell back, the rest of its rows one by one, unread."""
        if self.fallback is not None:
            return at + 1
        return super().feed_from(rows, at, stop)

    def finish(self, connection: Mapping) -> Carried:
        """The new frames end. `connection`: its schema.CONNECTIONS row (or just its connection_id)."""
        whole = self.whole
        if self.fallback is None:
            done = super().finish(connection)
            self.fallback = self.fallback or whole.fallback
        if self.fallback is not None:
            return Carried(self.fallback, timeline=whole.timeline)
        return Carried(None, done.raw_findings, done.checkpoint, whole.no_checkpoint, whole.stale, whole.touched,
                       whole.boundary_ns, whole.timeline)


@dataclass
class Carried:
    """What carrying one connection on gives besides its records and metric rows."""
    fallback: str | None                   # why it must be analysed whole instead (then nothing else is set)
    raw_findings: list[RawFinding] | None = None
    checkpoint: Checkpoint | None = None   # None: the connection ended, or see `no_checkpoint`
    no_checkpoint: str | None = None
    stale: list = field(default_factory=list)      # the last run's provisional records: rows to delete first
    touched: set = field(default_factory=set)      # (channel, incarnation) whose metrics from boundary_ns are replaced
    boundary_ns: int | None = None                 # None: a connection new to this run (nothing stored to patch)
    timeline: ConnectionTimeline | None = None     # the state after the new frames


@dataclass
class CarriedOn:
    """`carry_on_connection`'s answer: what CarriedAnalysis streamed, collected."""
    done: Carried
    final: list = field(default_factory=list)      # records no later run changes
    open: list = field(default_factory=list)       # records of what is still open (the next run replaces them)
    metrics: list = field(default_factory=list)    # channel_metrics of the touched incarnations from boundary_ns on


def carry_on_connection(checkpoint: Checkpoint | None, rows: Iterable[Mapping], settings: Settings,
                        connection: Mapping) -> CarriedOn:
    """A connection's new frame rows (seq order, ANALYSIS_COLUMNS) fed on from `checkpoint` (None:
    its first rows), everything CarriedAnalysis streams collected: for a caller whose connections
    are small (tests, a replay of one connection)."""
    out = CarriedOn(None)
    analysis = None
    for row in rows:
        if analysis is None:
            analysis = CarriedAnalysis(checkpoint, connection["connection_id"], row.get("agent_id"), settings,
                                       out.final.append, out.metrics.extend, out_open_record=out.open.append)
        analysis.feed(row)
    if analysis is None:
        out.done = Carried("no frames")
        return out
    out.done = analysis.finish(connection)
    return out


def detectors_state(detectors: ConnectionDetectors, timeline) -> dict:
    """The checkpoint's detectors' state: taken once the final records are in and before the open
    ones (which the next run feeds again, changed or not), folded as far as the machine allows."""
    detectors.fold(*item_horizons(timeline))
    return to_state(detectors)


def findings_of(detectors: ConnectionDetectors, connection: Mapping) -> list[RawFinding]:
    detectors.context.connection = dict(connection)
    return detectors.raw_findings()
