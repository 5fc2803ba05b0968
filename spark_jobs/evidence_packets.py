"""The last step of the findings: the capture packet of every frame their evidence names.

The pass sees each frame once, and which frames a finding names is known only at its connection's
end, so the packets are looked up afterwards: the named (connection, seq) pairs pick their rows out
of a scan of `frames` (a semi-join with the few pairs, broadcast when small: the frames table is
never shuffled), and each connection's raw findings meet its packets in one grouped Arrow call
that finishes them (analyzer/detectors/common.py's `finish`, the one implementation).

A run has findings of both sorts to finish, the pass's (its raw findings: of every connection on a
full run, of the carried connections on a scoped one) and the message kinds' (detectors/):
`finished_together` looks up both in one scan, read from the first day any of their evidence frames
can be on (frames are partitioned by `date`): a carried connection's frames start on the day the
connections table says it was first seen (as run.frames_of reads them), and a message kind's
evidence frames are deliveries, no earlier than the finding's first instant.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import reduce

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.detectors import MAX_EVIDENCE, RawFinding, finish

from .detectors.common import MeasuredFindings, finish_identified
from .timeline.plans import BROADCAST_ROWS, lookup, materialised, utc_day
from .types import spark_schema

PACKETS = ["connection_id", "seq", "source_packet", "source"]


def finished_findings(raw: DataFrame, frames: DataFrame, raw_rows: int | None = None) -> DataFrame:
    """schema.FINDINGS rows of the pass's raw findings (connection_pass.RAW_FINDINGS); `frames`:
    schema.FRAMES rows holding at least every frame of those connections. `raw_rows`: how many
    raw findings there are, if known (else they are counted: one Spark job more)."""
    named = _named(raw)
    if raw_rows is None:
        named = lookup(named)
    elif raw_rows * MAX_EVIDENCE <= BROADCAST_ROWS:
        named = F.broadcast(named)
    return _finished_with(raw, frames.select(*PACKETS).join(named, on=["connection_id", "seq"], how="left_semi"))


def finished_together(raw: DataFrame | None, raw_rows: int, raw_since: str | None, across: MeasuredFindings | None,
                      frames_since: Callable[[str | None], DataFrame], connections: DataFrame) -> DataFrame:
    """schema.FINDINGS rows of findings of both sorts: `raw`, the pass's raw findings (`raw_rows`
    of them) of connections whose frames start on the UTC day `raw_since` (None: the first day, or
    unknown), and `across`, the message kinds' (detectors/common.py; None: none). `frames_since(day)`:
    the frames table from that UTC day on (None: all of it)."""
    firsts, named = [], []
    if across is not None:
        if across.named:
            firsts.append(utc_day(across.first_ns))
        named.append(across.rows.select("connection_id", F.explode("evidence.seqs").alias("seq")))
    if raw is not None and raw_rows:
        firsts.append(raw_since)
        named.append(_named(raw))
    packets = frames_since(None).select(*PACKETS).limit(0)
    if firsts:
        named = reduce(DataFrame.unionByName, named).distinct()
        if raw_rows * MAX_EVIDENCE + (across.named if across is not None else 0) <= BROADCAST_ROWS:
            named = F.broadcast(named)
        since = None if None in firsts else min(firsts)
        packets = materialised(frames_since(since).select(*PACKETS)
                               .join(named, on=["connection_id", "seq"], how="left_semi"))
    finished = [] if raw is None else [_finished_with(raw, packets)]
    if across is not None:
        finished.append(finish_identified(across.rows, packets, connections, located=True))
    if not finished:
        return packets.sparkSession.createDataFrame([], spark_schema(schema.FINDINGS))
    return reduce(DataFrame.unionByName, finished)


def _named(raw: DataFrame) -> DataFrame:
    return raw.select("connection_id", F.explode("seqs").alias("seq")).distinct()


def _finished_with(raw: DataFrame, packets: DataFrame) -> DataFrame:
    """The raw findings finished, each connection's with its packets (the named frames' PACKETS)."""
    return (raw.groupBy("connection_id").cogroup(packets.groupBy("connection_id"))
            .applyInArrow(_finish_connection, spark_schema(schema.FINDINGS)))


def _finish_connection(raw: pa.Table, packets: pa.Table) -> pa.Table:
    located = {row["seq"]: (row["source_packet"], row["source"]) for row in packets.to_pylist()}

    def packets_of(seqs):
        return [located.get(seq) for seq in seqs]

    rows = [finish(RawFinding(**json.loads(row["finding"])), json.loads(row["connection"]), packets_of)
            for row in raw.to_pylist()]
    return pa.Table.from_pylist(rows, schema=schema.FINDINGS)
