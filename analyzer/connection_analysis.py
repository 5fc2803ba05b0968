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

and an incremental run carries a connection on from that checkpoint, its timeline and its
detectors (`carry_on_connection`), reading only its new frames.

A connection of millions of frames streams: records and metric rows leave as they become final;
what stays is what the machine still holds, the checkpoint's boundary records and the detectors'
running state (analyzer/detectors: folded as the machine's horizon moves on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from .detectors import FRAME_COLUMNS, ConnectionDetectors, RawFinding, wants_frame
from .detectors.state import from_state, to_state
from .timeline import INPUT_COLUMNS
from .timeline.carry import Checkpoint, Continued, StateError, WholeConnection, continue_connection
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
    detectors' thresholds (spark_jobs/thresholds.py)."""
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
    def __init__(self, connection_id: str, agent_id: str | None, settings: Settings,
                 out_record: Callable, out_metrics: Callable[[list[dict]], None],
                 advance_every: int = ADVANCE_EVERY_ROWS, out_open_record: Callable | None = None):
        """`out_open_record`: where the records of what is still open when the data ends go (the
        checkpoint's provisional ones: the next run replaces them); by default `out_record`."""
        self.out_record, self.out_metrics, self.advance_every = out_record, out_metrics, advance_every
        self.out_open_record = out_open_record or out_record
        self.whole = WholeConnection(connection_id, agent_id, self._record, settings.bucket_ns, settings.overdue_ns)
        self.metrics: ChannelMetrics | None = ChannelMetrics(settings.bucket_seconds)
        self.detectors = ConnectionDetectors({"connection_id": connection_id}, settings.thresholds)
        self.metrics_redo: str | None = None
        self.rows = 0

    @property
    def connection_id(self) -> str:
        return self.whole.timeline.id

    def _record(self, record) -> None:
        self.out_record(record)
        self.detectors.record(record)
        if self.metrics is not None:
            try:
                self.metrics.feed((record,))
            except HorizonError as error:
                self._give_up_metrics(error)

    def feed(self, row: Mapping) -> None:
        if wants_frame(row):
            self.detectors.frame(row)
        self.whole.feed(row)
        self.rows += 1
        if self.rows % self.advance_every == 0:
            self.detectors.fold(*item_horizons(self.whole.timeline))
        if self.rows % self.advance_every == 0 and self.metrics is not None:
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


@dataclass
class CarriedOn:
    """One connection carried on from its checkpoint (carry.Continued) and its raw findings (None
    when it falls back: `continued.fallback` says why)."""
    continued: Continued
    raw_findings: list[RawFinding] | None


def carry_on_connection(checkpoint: Checkpoint | None, rows: Iterable[Mapping], settings: Settings,
                        connection: Mapping) -> CarriedOn:
    """A connection's new frame rows (seq order, ANALYSIS_COLUMNS) fed on from `checkpoint` (None:
    its first rows), the timeline and the detectors both: what an incremental run does for it in
    place of ConnectionAnalysis. A checkpoint without the detectors' state (or with state this code
    refuses, or of other thresholds) falls back: the connection is analysed whole."""
    if checkpoint is None:
        detectors = ConnectionDetectors({"connection_id": connection["connection_id"]}, settings.thresholds)
    elif checkpoint.detectors is None:
        return CarriedOn(Continued(fallback="its checkpoint holds no detectors' state"), None)
    else:
        try:
            detectors = from_state(checkpoint.detectors, {"connection_id": connection["connection_id"]},
                                   settings.thresholds)
        except StateError as refused:
            return CarriedOn(Continued(fallback=f"detectors' state refused: {refused}"), None)
    done = continue_connection(checkpoint, _frames_to(detectors, rows), settings.bucket_ns, settings.overdue_ns)
    if done.fallback:
        return CarriedOn(done, None)
    if done.ended:
        done.checkpoint = None  # its records are final, as a whole analysis has them; new frames: analysed whole
    for record in done.final:
        detectors.record(record)
    if done.checkpoint is not None:
        done.checkpoint.detectors = detectors_state(detectors, done.timeline)
    for record in done.open:
        detectors.record(record)
    return CarriedOn(done, findings_of(detectors, connection))


def _frames_to(detectors: ConnectionDetectors, rows: Iterable[Mapping]) -> Iterator[Mapping]:
    for row in rows:
        if wants_frame(row):
            detectors.frame(row)
        yield row


def detectors_state(detectors: ConnectionDetectors, timeline) -> dict:
    """The checkpoint's detectors' state: taken once the final records are in and before the open
    ones (which the next run feeds again, changed or not), folded as far as the machine allows."""
    detectors.fold(*item_horizons(timeline))
    return to_state(detectors)


def findings_of(detectors: ConnectionDetectors, connection: Mapping) -> list[RawFinding]:
    detectors.context.connection = dict(connection)
    return detectors.raw_findings()
