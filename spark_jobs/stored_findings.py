"""The findings about one connection from its stored rows: for new thresholds (the detectors'
state in the checkpoints was built under the old ones; connections carried on from their
checkpoints get their findings from the carried pass itself). The same detectors as the pass
(analyzer/detectors), fed what they read: the connection's records as the timeline tables hold
them, the few frame rows some kinds read (detectors.FRAME_METHODS) and its connection row.

The tables travel as one wide table (wide.py), shuffled by connection; within a connection the
frames are sorted by seq (the detectors read them in order; records in any order). Out come raw
findings (connection_pass.RAW_FINDINGS), finished as the pass's are (evidence_packets.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.detectors import FRAME_COLUMNS, FRAME_METHODS, ConnectionDetectors
from analyzer.timeline.tables import RECORD_TYPES

from .connection_pass import HEADER, RAW_FINDINGS, headers, raw_finding_rows
from .types import spark_schema
from .timeline.wide import RECORD, arrow_column, records_from_wide

FRAMES, CONNECTION = "frames", "connection"
# A frame's place among its connection's rows (null for the others: they sort first).
ORDER = "_frame_seq"


def stored_raw_findings(tables: dict[str, DataFrame], frames: DataFrame, connections: DataFrame,
                        thresholds, partitions: int | None = None) -> DataFrame:
    """RAW_FINDINGS of every connection from `tables` (the four timeline tables), `frames` and
    `connections` as stored."""
    spark = frames.sparkSession
    partitions = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))

    parts = [tables[name].select(
        "connection_id", F.lit(name).alias(RECORD), F.lit(None).cast("bigint").alias(ORDER),
        F.struct(*record_type.__slots__).alias(name))
        for name, record_type in RECORD_TYPES.items()]
    parts.append(frames.where(F.col("method").isin(*FRAME_METHODS))
                 .select("connection_id", F.lit(FRAMES).alias(RECORD), F.col("seq").alias(ORDER),
                         F.struct(*FRAME_COLUMNS).alias(FRAMES)))
    parts.append(headers(connections)
                 .select("connection_id", F.lit(CONNECTION).alias(RECORD), F.lit(None).cast("bigint").alias(ORDER),
                         HEADER))
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.unionByName(part, allowMissingColumns=True)

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _Partition(thresholds).run(batches)

    return (rows.repartition(partitions, "connection_id").sortWithinPartitions("connection_id", ORDER)
            .mapInArrow(run_partition, spark_schema(RAW_FINDINGS)))


class _Partition:
    def __init__(self, thresholds):
        self.thresholds = thresholds
        self.connection_id: str | None = None
        self.detectors: ConnectionDetectors | None = None
        self.header: str | None = None
        self.out: list[dict] = []

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column("connection_id").to_pylist()
            start = 0
            while start < len(ids):  # runs of one connection (the rows are sorted by it)
                end = start
                while end < len(ids) and ids[end] == ids[start]:
                    end += 1
                self._feed(ids[start], batch.slice(start, end - start))
                start = end
            if self.out:
                yield from self._flush()
        self._finish()
        yield from self._flush()

    def _feed(self, connection_id: str, rows: pa.RecordBatch) -> None:
        if connection_id != self.connection_id:
            self._finish()
            self.connection_id = connection_id
            self.detectors = ConnectionDetectors({"connection_id": connection_id}, self.thresholds)
        kinds = rows.column(RECORD)
        for name, record_type in RECORD_TYPES.items():
            for record in records_from_wide(rows, name, record_type):
                self.detectors.record(record)
        frames = rows.filter(pc.equal(kinds, FRAMES))
        if frames.num_rows:
            columns = {c: arrow_column(frames, FRAMES, c).to_pylist() for c in FRAME_COLUMNS}
            for values in zip(*columns.values()):
                self.detectors.frame(dict(zip(FRAME_COLUMNS, values)))
        header = rows.filter(pc.equal(kinds, CONNECTION))
        if header.num_rows:
            self.header = header.column(HEADER)[0].as_py()

    def _finish(self) -> None:
        if self.detectors is None:
            return
        connection = json.loads(self.header) if self.header is not None else {"connection_id": self.connection_id}
        self.detectors.context.connection = connection
        self.out += raw_finding_rows(connection, self.detectors.raw_findings())
        self.detectors, self.header = None, None

    def _flush(self) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_pylist(self.out, schema=RAW_FINDINGS)
        self.out.clear()
        yield from table.to_batches()
