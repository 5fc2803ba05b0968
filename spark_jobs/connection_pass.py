"""The one pass: every connection of a run in seq order through the reference state machine, whole
or, in a carried pass, on from its checkpoint (docs/analysis.md, "One implementation of the rules,
distributed by Spark", 1 and 3; "Incremental", Carried connections). Its tasks write WRITTEN_TABLES
as uncommitted files; the few rows left come back as one wide table (timeline/wide.py), which
`pass_summary` reads whichever executor ran it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from itertools import groupby

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.columns import batch_rows
from analyzer.connection_analysis import (ADVANCE_EVERY_ROWS, ANALYSIS_COLUMNS, CarriedAnalysis, ConnectionAnalysis,
                                          Settings)
from analyzer.detectors import evidence_seqs
from analyzer.detectors.common import nulls_first
from analyzer.detectors.messages import came_back
from analyzer.rows import dicts_to_table
from analyzer.timeline.carry import FORMAT, Checkpoint, dump
from analyzer.timeline.metrics import channel_metrics
from analyzer.timeline.metrics import to_table as metrics_table
from analyzer.timeline.records import Delivery
from analyzer.timeline.tables import RECORD_TYPES, SORT_KEYS, RecordTables, to_tables

from .carried_pass import FALLBACK, FIRST_BUCKET, STALE, STATE_COLUMNS, STORED, TOUCHED, resumed
from .provisional import flagged, metric_flags, open_buckets
from .table_files import rows_in
from .timeline.tables import CHANNEL_METRICS, TIMELINE_TABLES, as_stored
from .timeline.plans import arrow_batches_by_rows
from .timeline.wide import ROLE, rows_from_wide, to_wide, wide_schema
from .types import spark_schema
from .wide_writes import FILE_ROWS, FILES, FilesWriter, add_actions

# A header row sorts before every frame of its connection (frame seqs count from 1).
HEADER_SEQ = -1
HEADER = "connection"        # the header row's column: its schema.CONNECTIONS row as JSON
# The connections row's columns a connection's facts take, in the order the first row seen is picked by.
CONNECTION_FIELDS = ("first_ts_ns", "agent_id", "connection_name", "client_addr", "client_port", "server_addr",
                     "server_port", "source")
CONNECTION_COLUMNS = ["connection_id", *CONNECTION_FIELDS, "last_ts_ns"]
CONNECTION_KEY = ("connection_id", *CONNECTION_FIELDS)
CONNECTION_FACTS = pa.schema([("connection_id", pa.string()), (HEADER, pa.string())])
# A connection's new frame rows, the records its checkpoint held (a carried pass), and why its
# channel_metrics were computed again from all its records (a whole one: metrics.HorizonError).
TALLY = pa.schema([("connection_id", pa.string()), ("frames", pa.int64()), ("carried_records", pa.int64()),
                   ("metrics_redo", pa.string())])
# A finding of one connection before its evidence packets are known: the RawFinding and the
# connection row (JSON, for analyzer.detectors.finish), and the frame seqs its evidence names.
RAW_FINDINGS = pa.schema([("connection_id", pa.string()), ("connection", pa.string()), ("finding", pa.string()),
                          ("seqs", pa.list_(pa.int64()))])
# Deliveries out of a flush the cross-connection kinds can start from (cross_connection_findings.py).
COUNTS = pa.schema([("came_back", pa.int64())])
STATE_TABLE = "analysis_state"
# The tables whose rows the pass's tasks write as files (the wide table holds none of them).
WRITTEN_TABLES = {**TIMELINE_TABLES, "channel_metrics": CHANNEL_METRICS, STATE_TABLE: schema.ANALYSIS_STATE}
# The rows gathered till a flush, besides analysis_state's.
GATHERED = ("raw_findings", "tally", "touched", "fallback")
# The timeline tables' rows are a carried pass's stale ones (role STALE): stored rows its written rows replace.
PASS_TABLES = {**TIMELINE_TABLES, "raw_findings": RAW_FINDINGS, "tally": TALLY, "touched": TOUCHED,
               "fallback": FALLBACK, "counts": COUNTS, "files": FILES}
WIDE = wide_schema(PASS_TABLES)
# Records (or connections' state rows) gathered before they leave as one Arrow batch: large enough
# that the Arrow conversion is amortised, small enough that a hot connection streams.
FLUSH_RECORDS = 50_000


def connection_pass(frames: DataFrame, connections: DataFrame, settings: Settings, frames_version: int | None,
                    write_to: str, states: DataFrame | None = None, partitions: int | None = None,
                    flush_records: int | None = None, advance_every: int = ADVANCE_EVERY_ROWS,
                    file_rows: int | None = None) -> DataFrame:
    """The wide table (PASS_TABLES) of every connection in `frames` (at least ANALYSIS_COLUMNS),
    each carried on from its analysis_state row in `states` where given (a carried pass), else
    whole; `connections` without frames here are skipped. The tasks write WRITTEN_TABLES into `write_to`."""
    flush_records, file_rows = flush_records or FLUSH_RECORDS, file_rows or FILE_ROWS   # read here: tests set them
    carried = states is not None

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _Partition(settings, frames_version, flush_records, advance_every, write_to, file_rows,
                          carried).run(batches)

    # One header row per connection: its `connection_facts` as JSON, made in one task (the
    # connections table has a row per connection and agent: small next to the frames).
    heads = connections.select(*CONNECTION_COLUMNS).coalesce(1).mapInArrow(_facts_as_json,
                                                                           spark_schema(CONNECTION_FACTS))
    if carried:   # and its analysis_state row's, where it has one (it may have only a connections row)
        heads = states.select("connection_id", *STATE_COLUMNS, F.lit(True).alias(STORED)).join(
            heads, on="connection_id", how="full")
    rows = frames.select(*ANALYSIS_COLUMNS).unionByName(heads.withColumn("seq", F.lit(HEADER_SEQ).cast("bigint")),
                                                        allowMissingColumns=True)
    partitions = partitions or int(rows.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return (rows.repartition(partitions, "connection_id").sortWithinPartitions("connection_id", "seq")
            .mapInArrow(run_partition, spark_schema(WIDE)))


def _facts_as_json(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    batches = list(batches)
    if batches:
        facts = connection_facts(pa.Table.from_batches(batches))
        yield pa.RecordBatch.from_pylist([{"connection_id": connection_id, HEADER: json.dumps(row)}
                                          for connection_id, row in facts.items()], schema=CONNECTION_FACTS)


def connection_facts(rows: pa.Table | None) -> dict[str, dict]:
    """What a finding takes of its connection, per connection, as its JSON reads back (nulls left
    out): the row first seen (should two agents have seen it), with the last time any of them saw it."""
    out = {}
    for connection_id, group in groupby(sorted(rows.select(CONNECTION_COLUMNS).to_pylist() if rows is not None else [],
                                               key=lambda row: nulls_first(row[c] for c in CONNECTION_KEY)),
                                        key=lambda row: row["connection_id"]):
        group = list(group)
        last = [row["last_ts_ns"] for row in group if row["last_ts_ns"] is not None]
        first = {"connection_id": connection_id, **{c: group[0][c] for c in CONNECTION_FIELDS},
                 "last_ts_ns": max(last) if last else None}
        out[connection_id] = {k: v for k, v in first.items() if v is not None}
    return out


@dataclass
class PassSummary:
    """What the pass gives the run (its wide table, collected)."""
    written: dict[str, list[AddAction]]   # per table of WRITTEN_TABLES
    raw_findings: pa.Table         # RAW_FINDINGS
    tally: pa.Table                # TALLY: a row per connection analysed (not fallen back)
    came_back: int                 # COUNTS' sum (a whole pass's; a carried one's counts what fallbacks took back)
    stale: pa.Table                # the wide table's stored timeline rows the written ones replace (carried)
    touched: pa.Table              # TOUCHED: incarnations whose channel_metrics are recomputed (carried)
    fallbacks: dict[str, str]      # connection -> why it must be analysed whole instead (carried)

    @property
    def rows(self) -> dict[str, int]:
        """Rows of each table written (the files' statistics), and of raw findings."""
        return {**{name: rows_in(self.written.get(name, [])) for name in WRITTEN_TABLES},
                "raw_findings": self.raw_findings.num_rows}

    @property
    def frames(self) -> int:       # frame rows read
        return pc.sum(self.tally["frames"]).as_py() or 0

    @property
    def connections(self) -> int:
        return self.tally.num_rows

    @property
    def carried_records(self) -> int:   # records their checkpoints held
        return pc.sum(self.tally["carried_records"]).as_py() or 0


def summarised_pass(wide: DataFrame, carried: bool) -> PassSummary:
    """The pass run and its wide table collected, in one Spark job; each table in one chunk (Spark 4.2
    drops every chunk after an empty one of a chunked Arrow table it is given). Its input rows are
    small (frames and connection rows) but a carried pass's header rows, which hold checkpoints."""
    with nullcontext() if carried else arrow_batches_by_rows(wide.sparkSession):
        return pass_summary(wide.toArrow().combine_chunks())


def pass_summary(rows: pa.Table) -> PassSummary:
    """The pass's wide table (Spark's collected, or the local executor's) as the run reads it."""
    fallback = rows_from_wide(rows, "fallback", FALLBACK)
    return PassSummary(add_actions(rows_from_wide(rows, "files", FILES).to_pylist()),
                       rows_from_wide(rows, "raw_findings", RAW_FINDINGS), rows_from_wide(rows, "tally", TALLY),
                       pc.sum(rows_from_wide(rows, "counts", COUNTS)["came_back"]).as_py() or 0,
                       rows.filter(pc.equal(rows[ROLE], STALE)), rows_from_wide(rows, "touched", TOUCHED),
                       dict(zip(fallback["connection_id"].to_pylist(), fallback["reason"].to_pylist())))


class _Partition:
    """A partition's rows, each connection's header row (if any) then its frames in seq order, each
    connection through ConnectionAnalysis, or, in a `carried` pass, CarriedAnalysis from the
    checkpoint in its header row (carried_pass.resumed). Between Arrow batches, once FLUSH_RECORDS
    are gathered, its records and metric rows go to the task's own files (WRITTEN_TABLES) and the
    rest leaves as the wide table."""

    def __init__(self, settings: Settings, frames_version: int | None, flush_records: int, advance_every: int,
                 write_to: str, file_rows: int = FILE_ROWS, carried: bool = False):
        self.settings, self.frames_version, self.carried = settings, frames_version, carried
        self.flush_records, self.advance_every = flush_records, advance_every
        self.writers = {name: FilesWriter(write_to, name, table_schema, file_rows, SORT_KEYS.get(name, ()))
                        for name, table_schema in WRITTEN_TABLES.items()}
        # Each counts the deliveries the cross-connection kinds can start from (COUNTS).
        self.records = RecordTables(Delivery, came_back)
        self.open_records = RecordTables(Delivery, came_back)   # the checkpoints' provisional records
        self.came_back = 0                          # of the records sent to the writers since the last flush
        # Emptied in place by each flush, never replaced: a connection's machine keeps appending to them.
        self.metrics: list[dict] = []
        self.stale: list = []                      # carried connections' stored records their rows replace
        self.open_buckets: dict[str, tuple] = {}   # connection -> provisional.open_buckets, till the flush
        self.rows: dict[str, list[dict]] = {name: [] for name in (STATE_TABLE, *GATHERED)}   # by table
        self.connection: dict | None = None        # the current connection's schema.CONNECTIONS row
        self.carried_records = 0                   # the records the current connection's checkpoint held

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current = header = current_id = feed_from = None
        for batch in batches:
            rows = batch_rows(batch)
            if type(rows) is not list:  # the reference path's lazy map (columns.py)
                rows = list(rows)
            at, stop = 0, len(rows)
            while at < stop:
                row = rows[at]
                connection_id = row["connection_id"]
                if current is None or connection_id != current_id:
                    if current is not None:
                        self._finish(current)
                        current = None
                    if row["seq"] == HEADER_SEQ:
                        header = row
                        at += 1
                        continue
                    if header is None or header["connection_id"] != connection_id:
                        header = {}   # none (a header with no frames here was skipped)
                    # Not kept: a carried one's holds its checkpoint's bytes, read once by _start.
                    current, header = self._start(connection_id, row, header), None
                    current_id, feed_from = current.connection_id, current.feed_from
                at = feed_from(rows, at, stop)
            if self._buffered() >= self.flush_records:
                yield from self._flush()
        if current is not None:
            self._finish(current)
        yield from self._flush()
        files = pa.Table.from_batches([writer.files() for writer in self.writers.values()], schema=FILES)
        yield from to_wide(WIDE, [("files", None, files)]).to_batches()

    def _start(self, connection_id: str, first: dict, header: dict) -> ConnectionAnalysis:
        self.connection = json.loads(header[HEADER]) if header.get(HEADER) else {"connection_id": connection_id}
        self.carried_records = header.get("carried_records") or 0
        out = (self.settings, self.records.append, self.metrics.extend, self.advance_every, self.open_records.append)
        if not self.carried:
            return ConnectionAnalysis(connection_id, first["agent_id"], *out)
        checkpoint, refused = resumed(header)
        return CarriedAnalysis(checkpoint, connection_id, first["agent_id"], *out, refused=refused)

    def _buffered(self) -> int:
        return (len(self.records) + len(self.open_records) + len(self.stale) + len(self.metrics)
                + len(self.rows[STATE_TABLE]))

    def _finish(self, analysis: ConnectionAnalysis) -> None:
        connection_id, done = analysis.connection_id, analysis.finish(self.connection)
        if self.carried:
            if done.fallback:
                if analysis.rows:   # it sent records and metric rows out
                    self._take_back(connection_id, list(self.writers))
                self.rows["fallback"].append({"connection_id": connection_id, "reason": done.fallback})
                return
            self.stale += done.stale
            from_ns = FIRST_BUCKET if done.boundary_ns is None else done.boundary_ns
            self.rows["touched"] += [{"connection_id": connection_id, "channel": channel, "incarnation": incarnation,
                                      "from_ns": from_ns} for channel, incarnation in sorted(done.touched)]
        redo = None if self.carried else done.metrics_redo
        self.rows["raw_findings"] += raw_finding_rows(self.connection, done.raw_findings)
        self.rows["tally"].append({"connection_id": connection_id, "frames": analysis.rows,
                                   "carried_records": self.carried_records, "metrics_redo": redo})
        if done.checkpoint is not None:
            self.open_buckets[connection_id] = open_buckets(done.checkpoint)
        self.rows[STATE_TABLE].append(state_row(done.checkpoint, analysis.whole.timeline, self.frames_version))
        if redo is not None:
            self._metrics_again(connection_id, done.checkpoint)

    def _take_back(self, connection_id: str, tables: list[str]) -> None:
        """The connection's rows of these tables out of what the partition gathered and wrote: its
        records first sent to the writers (RecordTables keeps none to cut out), which take them back."""
        self._records_out()
        self.metrics[:] = [row for row in self.metrics if row["connection_id"] != connection_id]  # in place: fed
        for name in tables:
            self.writers[name].drop(connection_id)

    def _metrics_again(self, connection_id: str, checkpoint: Checkpoint | None) -> None:
        """The connection's channel_metrics computed again from all its records, in place of the
        rows it streamed, which its frame times going back would have changed (metrics.HorizonError).
        Rare: merged captures, a clock stepped back."""
        self._take_back(connection_id, ["channel_metrics"])
        records = []
        for name in ("deliveries", "publishes", "channels"):   # what channel_metrics reads
            rows = self.writers[name].of_connection(connection_id)
            records += map(RECORD_TYPES[name], *[rows[slot].to_pylist() for slot in RECORD_TYPES[name].__slots__])
        metrics = channel_metrics(records, self.settings.bucket_seconds)
        open_from = {} if checkpoint is None else {connection_id: open_buckets(checkpoint)}
        self._write_metrics(metrics, open_from)

    def _write_metrics(self, metrics: list[dict], open_from: dict[str, tuple]) -> None:
        """channel_metrics rows to their writer, flagged provisional from `open_from` (provisional.open_buckets)."""
        self.writers["channel_metrics"].add(flagged(metrics_table(metrics), metric_flags(metrics, open_from)))

    def _records_out(self) -> None:
        """Timeline records to their writers (the checkpoints' open ones provisional)."""
        final, final_back = self.records.take(ordered=False)
        opened, opened_back = self.open_records.take(ordered=False)
        self.came_back += final_back + opened_back
        for name in RECORD_TYPES:
            rows = pa.concat_tables([as_stored(name, final[name], False), as_stored(name, opened[name], True)])
            self.writers[name].add(rows.select(TIMELINE_TABLES[name].names))

    def _flush(self) -> Iterator[pa.RecordBatch]:
        """Everything gathered out and emptied: records, metric and analysis_state rows to their
        writers, the others as the wide table."""
        if not (len(self.records) or len(self.open_records) or self.stale or self.metrics or any(self.rows.values())):
            return
        self._records_out()
        self._write_metrics(self.metrics, self.open_buckets)
        self.writers[STATE_TABLE].add(states_table(self.rows[STATE_TABLE]))
        stale = to_tables(self.stale, ordered=False)
        parts = [("counts", None, pa.Table.from_pylist([{"came_back": self.came_back}], schema=COUNTS)),
                 *[(name, STALE, as_stored(name, stale[name], True)) for name in RECORD_TYPES],
                 *[(name, None, pa.Table.from_pylist(self.rows[name], schema=PASS_TABLES[name])) for name in GATHERED]]
        wide = to_wide(WIDE, [part for part in parts if part[2].num_rows])
        self.came_back = 0
        for gathered in (self.metrics, self.stale, self.open_buckets, *self.rows.values()):
            gathered.clear()
        yield from wide.to_batches()


def raw_finding_rows(connection: dict, raw_findings: list) -> list[dict]:
    """RAW_FINDINGS rows of one connection's raw findings."""
    connection_json = json.dumps(connection)
    return [{"connection_id": connection["connection_id"], "connection": connection_json,
             "finding": json.dumps(asdict(raw)), "seqs": evidence_seqs([raw])} for raw in raw_findings]


def state_row(checkpoint: Checkpoint | None, timeline, frames_version: int | None) -> dict:
    """A connection's analysis_state row after its last frame: no checkpoint once it ended (new
    frames of it are then analysed whole)."""
    row = {"connection_id": timeline.id, "frames_version": frames_version, "last_seq": timeline.last_seq,
           "last_ts_ns": timeline.last_ts_ns, "carried_records": 0}
    if checkpoint is None:
        return row
    return {**row, "boundary_ns": checkpoint.boundary_ns,
            "carried_records": len(checkpoint.provisional) + len(checkpoint.boundary),
            "format": FORMAT, "checkpoint": dump(checkpoint)}


def states_table(rows: list[dict]) -> pa.Table:
    return dicts_to_table(rows, schema.ANALYSIS_STATE, {}, "last_ts_ns")
