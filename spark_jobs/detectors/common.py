"""What every detector shares: the shape of a raw finding, its evidence vocabulary, and the last
step that turns raw findings into rows of schema.FINDINGS.

A detector returns *raw findings*: the FINDINGS columns it knows (kind, where, span, count,
measure, summary) plus `evidence`, a struct with one field per kind of evidence (EVIDENCE). Fields
a kind does not use stay null, and `to_json` leaves null fields out, so each finding's JSON shows
only what applies to it. `evidence.seqs` are the frame rows (connection seq) the finding points
at; `finish` looks them up in `frames` once for all kinds, to add their capture packet numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analyzer import schema
from spark_jobs.timeline.plans import lookup, materialised, measured
from spark_jobs.types import spark_schema

# Items listed in a finding's evidence (tags, seqs, packets, ...): enough to open the first few in
# Wireshark; `count` says how many there are in all.
MAX_EVIDENCE = 20

SEVERITY = schema.FINDING_SEVERITY

# Evidence field -> Spark type: the fields these kinds use, in the order of the one vocabulary
# (analyzer/detectors/common.py, EVIDENCE), so every kind spells the same thing the same way.
EVIDENCE = {
    "seqs": "array<bigint>",                  # frame rows (connection seq) of the first items, in order
    "tags": "array<bigint>",                  # delivery tags
    "message_identities": "array<string>",
    "message_id": "string",                   # requeue_loop: the message_id property, if set
    "ended_by": "string", "end_seq": "bigint",  # how and where the channel incarnation ended
    "deliveries": "bigint", "bounces": "bigint", "x_death_max": "bigint",
    "channels": "array<string>",              # connection_id#channel of every place a message went
    "redelivered_on": "array<string>",        # connection_name (else connection_id) of the redeliveries
    "redelivered_on_channels": "array<string>",
}

INCARNATION = ["connection_id", "channel", "incarnation"]


def evidence(**fields: Column) -> Column:
    """The evidence struct: the given fields, typed; every other field null."""
    unknown = set(fields) - set(EVIDENCE)
    if unknown:
        raise KeyError(f"not evidence fields: {sorted(unknown)}")
    return F.struct(*[fields.get(name, F.lit(None)).cast(kind).alias(name) for name, kind in EVIDENCE.items()])


def raw_finding(df: DataFrame, kind: str, *, first_ts_ns: Column, last_ts_ns: Column, count: Column, summary: Column,
                evidence: Column, channel: Column | None = None, incarnation: Column | None = None,
                value: Column | None = None, threshold: Column | None = None,
                message_identity: Column | None = None, agent_id: Column | None = None) -> DataFrame:
    """`df`'s rows as raw findings of `kind`: the contract between detectors and `finish`."""
    null = F.lit(None)
    return df.select(
        F.lit(kind).alias("kind"),
        F.lit(SEVERITY[kind]).alias("severity"),
        F.col("connection_id"),
        (agent_id if agent_id is not None else F.col("agent_id")).cast("string").alias("agent_id"),
        (channel if channel is not None else F.col("channel")).cast("int").alias("channel"),
        (incarnation if incarnation is not None else F.col("incarnation")).cast("int").alias("incarnation"),
        first_ts_ns.cast("bigint").alias("first_ts_ns"),
        last_ts_ns.cast("bigint").alias("last_ts_ns"),
        count.cast("bigint").alias("count"),
        (value if value is not None else null).cast("double").alias("value"),
        (threshold if threshold is not None else null).cast("double").alias("threshold"),
        (message_identity if message_identity is not None else null).cast("string").alias("message_identity"),
        summary.cast("string").alias("summary"),
        evidence.alias("evidence"),
    )


def ranked(df: DataFrame, keys: list[str], order: list[str]) -> DataFrame:
    """Adds `_rank` (1, 2, ... within `keys` by `order`), so an aggregation can keep the first
    MAX_EVIDENCE items with `firsts` without collecting every row of a large group."""
    return df.withColumn("_rank", F.row_number().over(Window.partitionBy(*keys).orderBy(*order)))


def firsts(*columns: str | Column, rank: str = "_rank") -> Column:
    """Aggregate: the first MAX_EVIDENCE rows' `columns` as a sorted array of structs (sorted by
    the first column, which should be the order `ranked` used). collect_list skips the nulls."""
    return F.sort_array(F.collect_list(F.when(F.col(rank) <= MAX_EVIDENCE, F.struct(*columns))))


def finish(raw: DataFrame, frames: DataFrame, connections: DataFrame) -> DataFrame:
    """Raw findings -> schema.FINDINGS: stable id, who the connection is, capture packets of the
    evidence, timestamps and date. The final select is the schema contract."""
    # Computed once: with_source_packets reads the findings twice.
    return finish_identified(materialised(identified(raw)), frames, connections)


def identified(raw: DataFrame) -> DataFrame:
    """Raw findings with their `finding_id`."""
    return raw.withColumn("finding_id", finding_id())


@dataclass(frozen=True)
class MeasuredFindings:
    """Raw findings identified and materialised, with what the lookup of their packets needs."""
    rows: DataFrame
    named: int                  # evidence frames they name
    first_ns: int | None        # the first instant of the first of them


def measured_findings(raw: DataFrame) -> MeasuredFindings:
    """Raw findings `identified` and materialised, measured in the same Spark job."""
    rows, seen = measured(identified(raw), named=F.coalesce(F.sum(F.size("evidence.seqs")), F.lit(0)),
                          first_ns=F.min("first_ts_ns"))
    return MeasuredFindings(rows, seen["named"], seen["first_ns"])


def finish_identified(found: DataFrame, frames: DataFrame, connections: DataFrame, located: bool = False) -> DataFrame:
    """`finish` of raw findings already `identified` (and materialised: they are read twice).
    `located`: `frames` holds only the frames their evidence names, so none is searched for."""
    found = with_source_packets(found, frames, located)
    found = found.join(connection_facts(connections), on="connection_id", how="left")
    evidence_json = F.to_json(F.struct(*[F.col(f"evidence.{name}").alias(name) for name in EVIDENCE],
                                       F.col("source_packets")))
    contract = spark_schema(schema.FINDINGS)
    derived = {
        # UTC day by integer division: a double would blur the last instants before midnight.
        "date": F.date_from_unix_date(F.expr(f"first_ts_ns div {86_400 * 10**9}").cast("int")).cast("string"),
        "first_ts": to_timestamp("first_ts_ns"),
        "last_ts": to_timestamp("last_ts_ns"),
        "evidence": evidence_json,
        "source": F.coalesce("evidence_source", "connection_source"),
    }
    return conform(found.select(*[derived.get(field.name, F.col(field.name)).cast(field.dataType).alias(field.name)
                                  for field in contract]), contract)


def conform(df: DataFrame, contract: T.StructType) -> DataFrame:
    """`df` with the contract's nullability too: Spark calls a literal or a count never null, the
    table says nullable. A CASE without ELSE is nullable by type; only those columns are wrapped."""
    stricter = {field.name for field, wanted in zip(df.schema, contract) if not field.nullable and wanted.nullable}
    if not stricter:
        return df
    return df.select(*[F.when(F.lit(True), F.col(name)).alias(name) if name in stricter else F.col(name)
                       for name in df.columns])


def finding_id() -> Column:
    """A hash of what identifies a finding, so a rerun over the same data gives the same id."""
    parts = [F.col("kind"), F.col("connection_id"), F.col("channel"), F.col("incarnation"), F.col("message_identity")]
    return F.sha2(F.concat_ws("|", *[F.coalesce(p.cast("string"), F.lit("")) for p in parts]), 256)


def to_timestamp(ns: str) -> Column:
    # Integer division, as the agent derives its timestamps (analyzer/rows.py): never through a double.
    return F.timestamp_micros(F.expr(f"{ns} div 1000"))


def with_source_packets(found: DataFrame, frames: DataFrame, located: bool = False) -> DataFrame:
    """`found` plus `source_packets` (the capture packet number of each evidence frame, in
    evidence order) and `evidence_source` (the capture file of the first). The findings exploded
    and gathered again; the frames they name are picked out of the scan by a semi-join with the
    (few) evidence rows, broadcast when small, so the frames table is never shuffled (`located`:
    `frames` are those already)."""
    columns = [c for c in found.columns if c != "finding_id"]
    exploded = found.select("*", F.posexplode_outer("evidence.seqs").alias("_pos", "_seq"))
    packets = frames.select("connection_id", F.col("seq").alias("_seq"), "source_packet", "source")
    if not located:
        named = lookup(exploded.where(F.col("_seq").isNotNull()).select("connection_id", "_seq").distinct())
        packets = packets.join(named, on=["connection_id", "_seq"], how="left_semi")
    joined = exploded.join(packets, on=["connection_id", "_seq"], how="left")
    # A seq with no frame keeps its place (a null packet), so packets stay aligned with seqs.
    listed = F.when(F.col("_pos").isNotNull(), F.struct("_pos", "source_packet"))
    return joined.groupBy("finding_id").agg(
        *[F.any_value(c).alias(c) for c in columns],
        F.sort_array(F.collect_list(listed)).getField("source_packet").alias("source_packets"),
        F.min_by("source", F.when(F.col("source").isNotNull(), F.col("_pos"))).alias("evidence_source"),
    )


def connection_facts(connections: DataFrame) -> DataFrame:
    """One row per connection_id: its name and both ends as addr:port ([addr]:port for IPv6).
    Should a connection be in the table twice (two agents saw it), the first-seen row wins."""
    first = connections.groupBy("connection_id").agg(F.min(F.struct(
        "first_ts_ns", "agent_id", "connection_name", "client_addr", "client_port", "server_addr", "server_port",
        "source")).alias("c"))
    return first.select(
        "connection_id",
        F.col("c.connection_name").alias("connection_name"),
        endpoint("c.client_addr", "c.client_port").alias("client"),
        endpoint("c.server_addr", "c.server_port").alias("server"),
        F.col("c.source").alias("connection_source"),
    )


def endpoint(addr: str, port: str) -> Column:
    host = F.when(F.col(addr).contains(":"), F.concat(F.lit("["), F.col(addr), F.lit("]"))).otherwise(F.col(addr))
    return F.when(F.col(addr).isNotNull(), F.concat_ws(":", host, F.col(port).cast("string")))
