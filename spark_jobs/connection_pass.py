"""The one pass over the frames: each connection, in seq order, through the reference state machine.

A channel's timeline is a sequential state machine (DESIGN.md, "Analysis"): Spark moves the data,
Python runs the machine. The frames are shuffled by connection and sorted by (connection, seq)
within each partition; `mapInArrow` then streams every partition's Arrow batches through
`carry.WholeConnection`, one connection after the other, so a connection of millions of frames is
never held whole: records leave as Arrow batches as they become final. Out of the one pass come the
four timeline tables, each connection's checkpoint for the next incremental run (`analysis_state`)
and a tally of the frames read, as one wide table (wide.py): Spark takes one output schema per call.

Connections are independent, so the work scales out by partition; a hot connection is one task.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

from analyzer import schema
from analyzer.rows import dicts_to_table
from analyzer.timeline import INPUT_COLUMNS
from analyzer.timeline.carry import FORMAT, Checkpoint, WholeConnection, dump
from analyzer.timeline.tables import RECORD_TYPES, to_table

from .timeline.tables import TIMELINE_TABLES
from .timeline.wide import from_wide, to_wide, wide_schema
from .types import spark_schema

TALLY = pa.schema([("connection_id", pa.string()), ("frames", pa.int64())])
STATE_TABLE = "analysis_state"
PASS_TABLES = {**TIMELINE_TABLES, STATE_TABLE: schema.ANALYSIS_STATE, "tally": TALLY}
WIDE = wide_schema(PASS_TABLES)
# Records (or connections' state rows) gathered before they leave as one Arrow batch: large enough
# that the Arrow conversion is amortised, small enough that a hot connection streams.
FLUSH_RECORDS = 50_000


def connection_pass(frames: DataFrame, bucket_ns: int, overdue_ns: int, frames_version: int | None,
                    partitions: int | None = None, flush_records: int = FLUSH_RECORDS) -> DataFrame:
    """The wide table (PASS_TABLES) of every connection in `frames` (schema.FRAMES or INPUT_COLUMNS)."""
    spark = frames.sparkSession
    partitions = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _Partition(bucket_ns, overdue_ns, frames_version, flush_records).run(batches)

    return (frames.select(*INPUT_COLUMNS)
            .repartition(partitions, "connection_id")
            .sortWithinPartitions("connection_id", "seq")
            .mapInArrow(run_partition, spark_schema(WIDE)))


def pass_rows(wide: DataFrame, name: str) -> DataFrame:
    """One table's rows out of the pass's wide table."""
    return from_wide(wide, name, PASS_TABLES[name])


class _Partition:
    """One partition: its connections one after the other, records out in batches."""

    def __init__(self, bucket_ns: int, overdue_ns: int, frames_version: int | None, flush_records: int):
        self.bucket_ns, self.overdue_ns, self.frames_version = bucket_ns, overdue_ns, frames_version
        self.flush_records = flush_records
        # Emptied in place by each flush, never replaced: a connection's machine keeps appending to it.
        self.records: list = []
        self.states: list[dict] = []
        self.tally: list[dict] = []

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current: WholeConnection | None = None
        for batch in batches:
            for row in batch.to_pylist():
                if current is None or row["connection_id"] != current.timeline.id:
                    if current is not None:
                        self._finish(current)
                    current = WholeConnection(row["connection_id"], row.get("agent_id"), self.records.append,
                                              self.bucket_ns, self.overdue_ns)
                current.feed(row)
            if len(self.records) + len(self.states) >= self.flush_records:
                yield from self._flush()
        if current is not None:
            self._finish(current)
        yield from self._flush()

    def _finish(self, connection: WholeConnection) -> None:
        checkpoint = connection.finish()
        timeline = connection.timeline
        self.tally.append({"connection_id": timeline.id, "frames": connection.rows})
        self.states.append(state_row(checkpoint, self.frames_version) if checkpoint is not None else {
            "connection_id": timeline.id, "frames_version": self.frames_version, "last_seq": timeline.last_seq,
            "last_ts_ns": timeline.last_ts_ns, "carried_records": 0})

    def _flush(self) -> Iterator[pa.RecordBatch]:
        if not (self.records or self.states or self.tally):
            return
        parts = [(name, None, to_table(self.records, record_type)) for name, record_type in RECORD_TYPES.items()]
        parts += [(STATE_TABLE, None, states_table(self.states)),
                  ("tally", None, pa.Table.from_pylist(self.tally, schema=TALLY))]
        wide = to_wide(WIDE, parts)
        for gathered in (self.records, self.states, self.tally):
            gathered.clear()
        yield from wide.to_batches()


def state_row(checkpoint: Checkpoint, frames_version: int | None) -> dict:
    """The analysis_state row of a connection the next run carries on from this checkpoint."""
    timeline = checkpoint.timeline
    return {"connection_id": timeline.id, "frames_version": frames_version, "last_seq": timeline.last_seq,
            "last_ts_ns": timeline.last_ts_ns, "boundary_ns": checkpoint.boundary_ns,
            "carried_records": len(checkpoint.provisional) + len(checkpoint.boundary),
            "format": FORMAT, "checkpoint": dump(checkpoint)}


def states_table(rows: list[dict]) -> pa.Table:
    return dicts_to_table(rows, schema.ANALYSIS_STATE, {}, "last_ts_ns")
