"""Kinds that follow one message across deliveries, channels and connections: requeue_loop (one
finding per message) and redelivery_after_close (one per closed channel incarnation). The rules
are Python's (analyzer/detectors/messages.py); here Spark gathers each message's deliveries
wherever they went (a shuffle by message identity) and hands each group to them through Arrow.

Out come raw findings as the pass gives its own (connection_pass.RAW_FINDINGS: the finding as JSON,
its evidence seqs, its connection's row), with where they are (ACROSS_RAW), finished with theirs
(evidence_packets.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.detectors import RawFinding
from analyzer.detectors.messages import (BOUNCED_BY, CLOSED, COLUMNS, JOURNEY_ORDER, Journey, Redelivered,
                                         after_close_finding, redelivered_after_close)
from spark_jobs.connection_pass import connection_rows
from spark_jobs.thresholds import Thresholds
from spark_jobs.types import spark_schema

Tables = dict[str, DataFrame]

INCARNATION = ["connection_id", "channel", "incarnation"]
# A raw finding of these kinds, and where it is: what a scoped run's replace and the packets'
# lookup select by. Joined with its connection's row (`connection`) after.
ACROSS_RAW = pa.schema([schema.DELIVERIES.field(name) for name in INCARNATION] + [
    schema.DELIVERIES.field("message_identity"), ("first_ts_ns", pa.int64()), ("finding", pa.string()),
    ("seqs", pa.list_(pa.int64()))])
REDELIVERED = pa.schema([
    (name, pa.list_(pa.string()) if name in ("on", "places") else
     schema.DELIVERIES.field({"close_ns": "settle_ts_ns", "close_seq": "settle_seq"}.get(name, name)).type)
    for name in Redelivered.__dataclass_fields__])
# Rows of a group made Python objects at once: a message delivered millions of times stays Arrow.
ROWS_PER_BATCH = 10_000


def came_back() -> Column:
    """analyzer.detectors.messages.came_back as a Spark column."""
    return (F.col("message_identity").isNotNull()
            & ((F.col("redelivered") == True) | (F.coalesce(F.col("x_death_count"), F.lit(0)) > 0)))  # noqa: E712


def can_loop() -> Column:
    """Deliveries of a known message that make it a candidate for requeue_loop: bounced by the
    consumer, or dead-lettered before. A message none of whose deliveries is one is in no loop."""
    return (F.col("message_identity").isNotNull()
            & (F.col("outcome").isin(*BOUNCED_BY) | (F.coalesce(F.col("x_death_count"), F.lit(0)) > 0)))


def in_loop() -> Column:
    """analyzer.detectors.messages.in_loop as a Spark column: deliveries that can be part of a loop,
    bounced by the consumer or come back. requeue_loop reads no other."""
    return can_loop() | came_back()


def left_at_close() -> Column:
    """Deliveries left unacked when their channel or connection closed: redelivery_after_close's
    starting points."""
    return F.col("outcome").isin(*CLOSED) & F.col("settle_ts_ns").isNotNull()


def candidate() -> Column:
    """Every delivery either kind reads: in a loop, or left at a close."""
    return in_loop() | (F.col("message_identity").isNotNull() & left_at_close())


def requeue_loop(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """A message that keeps coming back because its consumer nacks or rejects it
    (analyzer/detectors/messages.py's Journey): one finding per message, pinned to the channel that
    bounced it most. Only the deliveries in the loop count (`in_loop`)."""
    deliveries = tables["deliveries"].filter(in_loop()).select(*COLUMNS)

    def loops(rows: pa.Table) -> pa.Table:
        journey = Journey()
        for row in _rows(rows.sort_by([(column, "ascending") for column in JOURNEY_ORDER])):
            journey.add(row)
        return _raw_table([journey.finding(thresholds)])

    found = deliveries.groupBy("message_identity").applyInArrow(loops, spark_schema(ACROSS_RAW))
    return _with_connections(found, tables["connections"])


def redelivery_after_close(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Deliveries left unacked when their channel or connection closed, delivered again
    (redelivered=true) afterwards, possibly to another consumer (analyzer/detectors/messages.py):
    one finding per closed incarnation. Each message's deliveries are matched where they meet
    (shuffled by message identity), then each incarnation's matches gathered (by incarnation)."""
    names = connection_rows(tables["connections"]).select(
        "connection_id", F.get_json_object("connection", "$.connection_name").alias("connection_name"))
    deliveries = (tables["deliveries"].filter(F.col("message_identity").isNotNull()
                                             & (left_at_close() | (F.col("redelivered") == True)))  # noqa: E712
                  .select(*COLUMNS).join(names, on="connection_id", how="left"))

    def matched(rows: pa.Table) -> pa.Table:
        found = redelivered_after_close(_rows(rows))
        return pa.Table.from_pylist([asdict(m) for m in found], schema=REDELIVERED)

    def gathered(rows: pa.Table) -> pa.Table:
        return _raw_table([after_close_finding(Redelivered(**{**m, "on": tuple(m["on"]), "places": tuple(m["places"])})
                                               for m in _rows(rows))])

    matches = deliveries.groupBy("message_identity").applyInArrow(matched, spark_schema(REDELIVERED))
    found = matches.groupBy(*INCARNATION).applyInArrow(gathered, spark_schema(ACROSS_RAW))
    return _with_connections(found, tables["connections"])


def _rows(table: pa.Table) -> Iterator[dict]:
    """A group's rows as dicts, a batch at a time: a message delivered millions of times is held
    as Arrow, not as Python objects."""
    for batch in table.to_batches(max_chunksize=ROWS_PER_BATCH):
        yield from batch.to_pylist()


def _raw_table(found: list[tuple[str, RawFinding] | None]) -> pa.Table:
    return pa.Table.from_pylist([
        {"connection_id": connection_id, "channel": raw.channel, "incarnation": raw.incarnation,
         "message_identity": raw.message_identity, "first_ts_ns": raw.first_ts_ns,
         "finding": json.dumps(asdict(raw)), "seqs": raw.evidence["seqs"]}
        for connection_id, raw in filter(None, found)], schema=ACROSS_RAW)


def _with_connections(found: DataFrame, connections: DataFrame) -> DataFrame:
    """The raw findings with their connection's row, as the pass's (connection_pass.RAW_FINDINGS)."""
    return found.join(connection_rows(connections), on="connection_id", how="left")
