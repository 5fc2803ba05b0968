"""The last step of the pass's findings: the capture packet of every frame their evidence names.

The pass sees each frame once, and which frames a finding names is known only at its connection's
end, so the packets are looked up afterwards: the named (connection, seq) pairs pick their rows out
of a scan of `frames` (a semi-join with the few pairs, broadcast when small: the frames table is
never shuffled), and each connection's raw findings meet its packets in one grouped Arrow call
that finishes them (analyzer/detectors/common.py's `finish`, the one implementation).
"""

from __future__ import annotations

import json

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.detectors import MAX_EVIDENCE, RawFinding, finish

from .timeline.plans import BROADCAST_ROWS, lookup
from .types import spark_schema


def finished_findings(raw: DataFrame, frames: DataFrame, raw_rows: int | None = None) -> DataFrame:
    """schema.FINDINGS rows of the pass's raw findings (connection_pass.RAW_FINDINGS); `frames`:
    schema.FRAMES rows holding at least every frame of those connections. `raw_rows`: how many
    raw findings there are, if known (else they are counted: one Spark job more)."""
    named = raw.select("connection_id", F.explode("seqs").alias("seq")).distinct()
    if raw_rows is None:
        named = lookup(named)
    elif raw_rows * MAX_EVIDENCE <= BROADCAST_ROWS:
        named = F.broadcast(named)
    packets = (frames.select("connection_id", "seq", "source_packet", "source")
               .join(named, on=["connection_id", "seq"], how="left_semi"))
    return (raw.groupBy("connection_id").cogroup(packets.groupBy("connection_id"))
            .applyInArrow(_finish_connection, spark_schema(schema.FINDINGS)))


def _finish_connection(raw: pa.Table, packets: pa.Table) -> pa.Table:
    located = {row["seq"]: (row["source_packet"], row["source"]) for row in packets.to_pylist()}

    def packets_of(seqs):
        return [located.get(seq) for seq in seqs]

    rows = [finish(RawFinding(**json.loads(row["finding"])), json.loads(row["connection"]), packets_of)
            for row in raw.to_pylist()]
    return pa.Table.from_pylist(rows, schema=schema.FINDINGS)
