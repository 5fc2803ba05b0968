"""The last step of the findings: the capture packet of every frame their evidence names.

The pass sees each frame once, and which frames a finding names is known only at its connection's
end, so the packets are looked up afterwards: the named (connection, seq) pairs pick their rows out
of a scan of `frames` (a semi-join with the few pairs, broadcast when small: the frames table is
never shuffled), and each connection's raw findings meet its packets in one grouped Arrow call
that finishes them (analyzer/detectors/common.py's `finish`, the one implementation, for every kind).

A run has findings of both sorts to finish, the pass's (its raw findings: of every connection on a
full run, of the carried connections on a scoped one) and the message kinds' (detectors/):
`finished_together` looks up both in one scan, read from the first day any of their evidence frames
can be on (frames are partitioned by `date`): a carried connection's frames start on the day the
connections table says it was first seen (as run.frames_of reads them), and a message kind's
evidence frames are deliveries, no earlier than the finding's first instant.

A scoped run knows most of its packets without that scan (`KnownPackets`): a carried connection's
findings mostly name the frames its stored findings named, and the rest are among the run's new
frames. A frame's packet never changes, and a stored finding's `source` is its first evidence
frame's (every frame row names its source: the capture file or interface). So a finding whose every
evidence frame is a new frame or has its packet in a stored finding, and whose first one has its
source there too, is finished from those; `frames` is scanned only for the frames of the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial, reduce

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.detectors import MAX_EVIDENCE, RawFinding, finish

from .connection_pass import RAW_FINDINGS
from .timeline.plans import BROADCAST_ROWS, lookup, materialised, measured, utc_day
from .types import spark_schema

PACKETS = ["connection_id", "seq", "source_packet", "source"]
PACKETS_SCHEMA = pa.schema([schema.FRAMES.field(name) for name in PACKETS])


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


@dataclass(frozen=True)
class MeasuredFindings:
    """The message kinds' raw findings (detectors/messages.ACROSS_RAW, with `connection`)
    materialised, with what the lookup of their packets needs."""
    rows: DataFrame
    named: int                  # evidence frames they name
    first_ns: int | None        # the first instant of the first of them


def measured_findings(raw: DataFrame) -> MeasuredFindings:
    """Raw findings materialised, measured in the same Spark job."""
    rows, seen = measured(raw, named=F.coalesce(F.sum(F.size("seqs")), F.lit(0)), first_ns=F.min("first_ts_ns"))
    return MeasuredFindings(rows, seen["named"], seen["first_ns"])


@dataclass(frozen=True)
class KnownPackets:
    """Where a scoped run looks for its findings' packets before it scans `frames`."""
    stored: DataFrame               # the findings table before the run (schema.FINDINGS)
    new_frames: DataFrame | None    # the run's new frames (at least PACKETS); None: none


def finished_together(raw: DataFrame | None, raw_rows: int, raw_since: Callable[[], str | None],
                      across: MeasuredFindings | None, frames_since: Callable[[str | None], DataFrame],
                      spark: SparkSession, known: KnownPackets | None = None) -> DataFrame:
    """schema.FINDINGS rows of findings of both sorts: `raw`, the pass's raw findings (`raw_rows`
    of them) of connections whose frames start on the UTC day `raw_since()` returns (None: the
    first day, or unknown; asked only if `frames` is scanned), and `across`, the message kinds'
    (detectors/messages.py, measured; None: none). `frames_since(day)`: the frames table from that UTC day on
    (None: all of it). `known`: packets to take before scanning (the module's docstring)."""
    sets, firsts = [], []   # the findings' evidence seqs; the first days of their frames, as functions
    if across is not None and across.named:
        sets.append(across.rows.select("connection_id", "seqs"))
        firsts.append(partial(utc_day, across.first_ns))
    if raw is not None and raw_rows:
        sets.append(raw.select("connection_id", "seqs"))
        firsts.append(raw_since)
    named_rows = raw_rows * MAX_EVIDENCE + (across.named if across is not None else 0)
    packets = spark.createDataFrame([], spark_schema(PACKETS_SCHEMA))
    if sets:
        sets = reduce(DataFrame.unionByName, sets)
        if known is not None and named_rows <= BROADCAST_ROWS:
            located, unknown = _known(sets, known)
            packets = spark.createDataFrame(located, spark_schema(PACKETS_SCHEMA))
        else:
            unknown = sets.select("connection_id", F.explode("seqs").alias("seq")).distinct()
            unknown = F.broadcast(unknown) if named_rows <= BROADCAST_ROWS else unknown
        if unknown is not None:
            days = [first() for first in firsts]
            since = None if None in days else min(days)
            scanned = materialised(frames_since(since).select(*PACKETS)
                                   .join(unknown, on=["connection_id", "seq"], how="left_semi"))
            packets = scanned if known is None else packets.unionByName(scanned)
    raws = [] if raw is None else [raw.select(*RAW_FINDINGS.names)]
    if across is not None:
        raws.append(across.rows.select(*RAW_FINDINGS.names))
    if not raws:
        return spark.createDataFrame([], spark_schema(schema.FINDINGS))
    return _finished_with(reduce(DataFrame.unionByName, raws), packets)


def _known(sets: DataFrame, known: KnownPackets) -> tuple[pa.Table, DataFrame | None]:
    """One collect (and the broadcast it joins with), for every finding (`sets`: its connection_id
    and evidence seqs): its evidence frames' PACKETS where all are known (`known`) and the first's
    source too; the (connection_id, seq) of the others' frames, to scan for (broadcast; None: there
    are none)."""
    spark = sets.sparkSession
    named = sets.where(F.size("seqs") > 0).distinct()
    pairs = named.select("connection_id", "seqs", F.posexplode("seqs").alias("pos", "seq"))
    # The frames named, picked out of each source before anything is shuffled (one broadcast).
    wanted = F.broadcast(pairs.select("connection_id", "seq").distinct())
    sources = [_stored_packets(known.stored)]
    if known.new_frames is not None:
        sources.append(known.new_frames.select(*PACKETS))
    # A frame's packet and source are facts: where two sources have one, they are equal.
    info = (reduce(DataFrame.unionByName, sources).join(wanted, on=["connection_id", "seq"], how="left_semi")
            .groupBy("connection_id", "seq")
            .agg(F.max("source_packet").alias("source_packet"), F.max("source").alias("source")))
    frames = pairs.join(info, on=["connection_id", "seq"], how="left")
    findings = frames.groupBy("connection_id", "seqs").agg(
        (F.count_if(F.col("source_packet").isNull()) == 0).alias("all_packets"),
        F.max(F.when(F.col("pos") == 0, F.col("source").isNotNull())).alias("first_source"),
        F.collect_list(F.struct("seq", "source_packet", "source")).alias("frames"))
    located, unknown = {}, set()
    for row in findings.collect():
        connection_id = row["connection_id"]
        if row["all_packets"] and row["first_source"]:
            located.update(((connection_id, f["seq"]), (f["source_packet"], f["source"])) for f in row["frames"])
        else:
            unknown.update((connection_id, f["seq"]) for f in row["frames"])
    # A frame to scan for is taken from the scan, with its source.
    table = pa.Table.from_pylist([dict(connection_id=connection_id, seq=seq, source_packet=packet, source=source)
                                  for (connection_id, seq), (packet, source) in located.items()
                                  if (connection_id, seq) not in unknown], schema=PACKETS_SCHEMA)
    if not unknown:
        return table, None
    return table, F.broadcast(spark.createDataFrame(sorted(unknown), spark_schema(
        pa.schema([schema.FRAMES.field(c) for c in ("connection_id", "seq")]))))


def _stored_packets(stored: DataFrame) -> DataFrame:
    """PACKETS of the frames the stored findings name, as far as they tell: each located frame's
    packet, and the source of each finding's first frame where that one was located (else null)."""
    evidence = F.from_json("evidence", "struct<seqs: array<bigint>, source_packets: array<bigint>>")
    named = stored.select("connection_id", "source", evidence.alias("e"))
    frames = named.select("connection_id", "source", F.posexplode(F.arrays_zip(
        F.col("e.seqs").alias("seq"), F.col("e.source_packets").alias("packet"))).alias("pos", "f"))
    return frames.where(F.col("f.packet").isNotNull()).select(
        "connection_id", F.col("f.seq").alias("seq"), F.col("f.packet").alias("source_packet"),
        F.when(F.col("pos") == 0, F.col("source")).alias("source"))


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
