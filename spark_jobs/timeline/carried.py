"""Connections carried from run to run on Spark (the rules: analyzer/timeline/carry.py).

A scheduled run hands each connection's new frames, with its checkpoint (the `analysis_state`
table) and its connections row, to the reference state machine and the detectors resumed from
that checkpoint (analyzer/connection_analysis.py's `CarriedAnalysis`): only the new frames are
read. As in the pass over whole connections (connection_pass.py), the rows are shuffled by
connection and sorted by seq within each partition, each connection's stored state travelling
first (a header row), and `mapInArrow` streams them through the machine: a connection with
millions of new frames is never held whole, its records leave as Arrow batches as they become
final. Out come, as one wide table (wide.py): the rows to write, the rows they replace (role
`stale`), the channel_metrics rows of the incarnations whose metrics are recomputed from the
boundary bucket on (`touched`: they replace those buckets), the connection's findings before their
evidence packets (`raw_findings`, as the pass gives them), the next checkpoint (`state`), or why
the connection must be analysed whole instead (`fallback`; if some of its rows had already left,
`streamed`: the caller drops them, `without_fallbacks`).

Runs that analyse connections whole (the first, `--full`, `--since`, fallbacks) get their
checkpoints from the same pass that writes their tables (connection_pass.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, CarriedAnalysis, Settings
from analyzer.timeline.carry import FORMAT, StateError, load
from analyzer.timeline.metrics import to_table as metrics_table
from analyzer.timeline.tables import RECORD_TYPES, to_table

from ..provisional import flagged, metric_flags, open_buckets
from ..connection_pass import (FLUSH_RECORDS, HEADER, HEADER_SEQ, RAW_FINDINGS, ConnectionsPartition, headers,
                               raw_finding_rows, state_row, states_table)
from ..types import spark_schema
from .tables import CHANNEL_METRICS, TIMELINE_TABLES
from .wide import column, from_wide, to_wide, wide_schema

WRITE, STALE = "write", "stale"
# A connection new to the run has no stored metrics: its incarnations' buckets are all computed here.
FIRST_BUCKET = -(2**63)
TOUCHED = pa.schema([("connection_id", pa.string()), ("channel", pa.int32()), ("incarnation", pa.int32()),
                     ("from_ns", pa.int64())])
# `streamed`: rows of the connection had left the pass before it fell back.
FALLBACK = pa.schema([("connection_id", pa.string()), ("reason", pa.string()), ("streamed", pa.bool_())])
# A carried connection's new frame rows, and the records its checkpoint held (the run's report).
TALLY = pa.schema([("connection_id", pa.string()), ("frames", pa.int64()), ("carried_records", pa.int64())])
CARRIED_TABLES = {**TIMELINE_TABLES, "channel_metrics": CHANNEL_METRICS, "state": schema.ANALYSIS_STATE,
                  "touched": TOUCHED, "fallback": FALLBACK, "raw_findings": RAW_FINDINGS, "tally": TALLY}
# The header row's column saying the connection has an analysis_state row (it may have only a connections row).
STORED = "_stored"
# The header row's columns of the connection's analysis_state row.
STATE_COLUMNS = ("format", "checkpoint", "carried_records")
WIDE = wide_schema(CARRIED_TABLES)
# The roles a table's rows come in (the others' rows have none).
ROLES = {**{name: (WRITE, STALE) for name in RECORD_TYPES}, "channel_metrics": (WRITE,)}


def carry_on(new_frames: DataFrame, states: DataFrame, connections: DataFrame, settings: Settings,
             frames_version: int, partitions: int | None = None, flush_records: int | None = None) -> DataFrame:
    """The wide table for every connection of `new_frames` (ANALYSIS_COLUMNS), for the caller to
    materialise (it is read once per table). `states`: their analysis_state rows; `connections`:
    their schema.CONNECTIONS rows (for the findings, as the pass reads them: connection_pass.headers).
    Records leave every `flush_records` (None: FLUSH_RECORDS)."""
    spark = new_frames.sparkSession
    partitions = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    flush_records = flush_records or FLUSH_RECORDS

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _CarriedPartition(settings, frames_version, flush_records).run(batches)

    stored = (states.select("connection_id", *STATE_COLUMNS, F.lit(True).alias(STORED))
              .join(headers(connections).select("connection_id", HEADER), on="connection_id", how="full")
              .withColumn("seq", F.lit(HEADER_SEQ).cast("bigint")))
    rows = new_frames.select(*ANALYSIS_COLUMNS).unionByName(stored, allowMissingColumns=True)
    return (rows.repartition(partitions, "connection_id")
            .sortWithinPartitions("connection_id", "seq")
            .mapInArrow(run_partition, spark_schema(WIDE)))


def carried_rows(wide: DataFrame, name: str, role: str | None = None) -> DataFrame:
    return from_wide(wide, name, CARRIED_TABLES[name], role)


def without_fallbacks(wide: DataFrame, connection_ids: list[str]) -> DataFrame:
    """The wide table without any row of these connections (fallbacks whose rows had left the pass)."""
    of_connection: Column = F.coalesce(*[column(name, "connection_id") for name in CARRIED_TABLES])
    return wide.where(~of_connection.isin(connection_ids))


class _Carrying:
    """One connection of a partition on its way through CarriedAnalysis (or refused before it)."""

    def __init__(self, connection_id: str, header: dict | None, analysis: CarriedAnalysis | None,
                 refused: str | None, marks: tuple[int, int]):
        self.connection_id, self.analysis, self.refused = connection_id, analysis, refused
        header = header or {}  # not kept: it holds the checkpoint's bytes, read once into `analysis`
        self.connection = json.loads(header[HEADER]) if header.get(HEADER) else {"connection_id": connection_id}
        self.carried_records = header.get("carried_records") or 0   # what the checkpoint held
        self.marks = marks          # the partition's records and metric rows gathered before this connection's
        self.streamed = False       # some of its rows left in a flush
        self.frames = 0

    def feed(self, row: dict) -> None:
        self.frames += 1
        if self.analysis is not None:
            self.analysis.feed(row)


class _CarriedPartition(ConnectionsPartition):
    """The carried pass: each connection through CarriedAnalysis, records out in batches."""

    def __init__(self, settings: Settings, frames_version: int, flush_records: int):
        super().__init__(flush_records)
        self.settings, self.frames_version = settings, frames_version
        # Emptied in place by each flush, never replaced: a connection's machine keeps appending to them.
        self.final: list = []
        self.opened: list = []
        self.stale: list = []
        self.metrics: list[dict] = []
        self.open_buckets: dict[str, tuple] = {}   # connection -> provisional.open_buckets, till the flush
        self.rows: dict[str, list[dict]] = {name: [] for name in ("touched", "state", "tally", "raw_findings",
                                                                   "fallback")}

    def _start(self, connection_id: str, first: dict, header: dict | None) -> _Carrying:
        checkpoint, refused = None, None
        if header is not None and header.get(STORED):
            if header["checkpoint"] is None:
                # The last run kept none: it had ended, or its frame times went back (carry.py's `no_checkpoint`).
                refused = "no checkpoint: it had ended (closed or FIN/RST) or its frame times went back"
            elif header["format"] != FORMAT:
                refused = f"checkpoint format {header['format']}, not {FORMAT}"
            else:
                try:
                    checkpoint = load(header["checkpoint"])
                except StateError as error:
                    refused = f"checkpoint refused: {error}"
        analysis = None if refused else CarriedAnalysis(checkpoint, connection_id, first["agent_id"], self.settings,
                                                        self.final.append, self.metrics.extend,
                                                        out_open_record=self.opened.append)
        return _Carrying(connection_id, header, analysis, refused, (len(self.final), len(self.metrics)))

    def _buffered(self) -> int:
        return len(self.final) + len(self.opened) + len(self.stale) + len(self.metrics)

    def _finish(self, carrying: _Carrying) -> None:
        connection_id = carrying.connection_id
        done = carrying.analysis.finish(carrying.connection) if carrying.analysis is not None else None
        fallback = carrying.refused or done.fallback
        if fallback:
            del self.final[carrying.marks[0]:], self.metrics[carrying.marks[1]:]
            self.rows["fallback"].append({"connection_id": connection_id, "reason": fallback,
                                          "streamed": carrying.streamed})
            return
        self.stale += done.stale
        if done.checkpoint is not None:
            self.open_buckets[connection_id] = open_buckets(done.checkpoint)
        from_ns = FIRST_BUCKET if done.boundary_ns is None else done.boundary_ns
        self.rows["touched"] += [{"connection_id": connection_id, "channel": channel, "incarnation": incarnation,
                                  "from_ns": from_ns} for channel, incarnation in sorted(done.touched)]
        self.rows["state"].append(state_row(done.checkpoint, done.timeline, self.frames_version))
        self.rows["tally"].append({"connection_id": connection_id, "frames": carrying.frames,
                                   "carried_records": carrying.carried_records})
        self.rows["raw_findings"] += raw_finding_rows(carrying.connection, done.raw_findings)

    def _flush(self) -> Iterator[pa.RecordBatch]:
        current = self.current
        if current is not None:  # what it gathered leaves now: should it fall back, the caller drops it
            current.streamed = current.streamed or (len(self.final), len(self.metrics)) != current.marks
            current.marks = (0, 0)
        if not (self.final or self.opened or self.stale or self.metrics or any(self.rows.values())):
            return
        parts = []
        for records, role, provisional in ((self.final, WRITE, False), (self.opened, WRITE, True),
                                           (self.stale, STALE, True)):
            parts += [(name, role, flagged(to_table(records, record_type), provisional))
                      for name, record_type in RECORD_TYPES.items()]
        parts += [("channel_metrics", WRITE, flagged(metrics_table(self.metrics),
                                                     metric_flags(self.metrics, self.open_buckets))),
                  ("state", None, states_table(self.rows["state"]))]
        parts += [(name, None, pa.Table.from_pylist(self.rows[name], schema=CARRIED_TABLES[name]))
                  for name in ("touched", "tally", "raw_findings", "fallback")]
        wide = to_wide(WIDE, [part for part in parts if part[2].num_rows])
        for gathered in (self.final, self.opened, self.stale, self.metrics, self.open_buckets, *self.rows.values()):
            gathered.clear()
        yield from wide.to_batches()
