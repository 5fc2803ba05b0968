"""Kinds that follow one message across deliveries, channels and connections: requeue_loop (one
finding per message) and redelivery_after_close (one per closed channel incarnation). The rules
are Python's (analyzer/detectors/messages.py); here Spark gathers each message's deliveries
wherever they went (a shuffle by message identity) and hands each group to them through Arrow.

Out come raw findings as the pass gives its own (connection_pass.RAW_FINDINGS: the finding as JSON,
its evidence seqs, its connection's row), with where they are (ACROSS_RAW), finished with theirs
(evidence_packets.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from functools import partial
from itertools import chain, groupby
from operator import itemgetter

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analyzer.columns import batch_rows
from analyzer.detectors import RawFinding
from analyzer.detectors.messages import (BOUNCED_BY, CLOSED, COLUMNS, JOURNEY_ORDER, Journey, Redelivered,
                                         after_close_finding, redelivered_after_close)
from spark_jobs.connection_pass import connection_rows, finding_fields
from spark_jobs.thresholds import Thresholds
from spark_jobs.types import spark_schema

Tables = dict[str, DataFrame]

INCARNATION = ["connection_id", "channel", "incarnation"]
_str, _i32, _i64 = pa.string(), pa.int32(), pa.int64()
# A raw finding of these kinds, and where it is: what a scoped run's replace and the packets'
# lookup select by. Joined with its connection's row (`connection`) after.
ACROSS_RAW = pa.schema([("connection_id", _str), ("channel", _i32), ("incarnation", _i32),
                        ("message_identity", _str), ("first_ts_ns", _i64), ("finding", _str),
                        ("seqs", pa.list_(_i64))])
# analyzer.detectors.messages.Redelivered, field for field: redelivery_after_close's matches
# between its two shuffles.
REDELIVERED = pa.schema([("connection_id", _str), ("channel", _i32), ("incarnation", _i32), ("seq", _i64),
                         ("agent_id", _str), ("ts_ns", _i64), ("close_ns", _i64), ("close_seq", _i64),
                         ("outcome", _str), ("delivery_tag", _i64), ("message_identity", _str),
                         ("on", pa.list_(_str)), ("places", pa.list_(_str))])
# Output rows gathered before they leave as one Arrow batch.
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
    def loop(deliveries: Iterator[dict]) -> list[tuple[str, RawFinding] | None]:
        journey = Journey()
        for d in deliveries:
            journey.add(d)
        return [journey.finding(thresholds)]

    deliveries = tables["deliveries"].filter(in_loop()).select(*COLUMNS)
    found = _by_group(deliveries, ["message_identity"], JOURNEY_ORDER, _raw_rows(loop), ACROSS_RAW)
    return _with_connections(found, tables["connections"])


def redelivery_after_close(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Deliveries left unacked when their channel or connection closed, delivered again
    (redelivered=true) afterwards, possibly to another consumer (analyzer/detectors/messages.py):
    one finding per closed incarnation. Each message's deliveries are matched where they meet
    (gathered by message identity), then each incarnation's matches gathered (by incarnation)."""
    names = connection_rows(tables["connections"]).select(
        "connection_id", F.get_json_object("connection", "$.connection_name").alias("connection_name"))
    deliveries = (tables["deliveries"].filter(F.col("message_identity").isNotNull()
                                             & (left_at_close() | (F.col("redelivered") == True)))  # noqa: E712
                  .select(*COLUMNS).join(names, on="connection_id", how="left"))

    def matched(deliveries: Iterator[dict]) -> list[dict]:
        return [asdict(m) for m in redelivered_after_close(deliveries)]

    def gathered(matches: Iterator[dict]) -> list[tuple[str, RawFinding] | None]:
        return [after_close_finding(Redelivered(**m) for m in matches)]

    matches = _by_group(deliveries, ["message_identity"], (), matched, REDELIVERED)
    found = _by_group(matches, INCARNATION, ("seq",), _raw_rows(gathered), ACROSS_RAW)
    return _with_connections(found, tables["connections"])


def _by_group(rows: DataFrame, key: list[str], order: Sequence[str],
              decide: Callable[[Iterator[dict]], list[dict]], out: pa.Schema) -> DataFrame:
    """`decide(rows)` of each group of `rows` with the same `key`, the group's rows in `order`:
    `out` rows. Spark gathers each group in one partition, sorted; Python takes the partition's
    groups one after the other, a group's rows as they stream (a grouped Arrow function would
    make every group an Arrow table and a call of its own: ~0.2 ms each, 30 s for the bench lake's
    83 k messages)."""
    return (rows.repartition(*key).sortWithinPartitions(*key, *order)
            .mapInArrow(partial(each_group, key, decide, out), spark_schema(out)))


def each_group(key: Sequence[str], decide: Callable[[Iterator[dict]], list[dict]], out: pa.Schema,
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`decide(rows)` of each run of rows with the same `key` in `batches` (a partition sorted by
    it; a run may span batches): `out` batches of up to about ROWS_PER_BATCH rows."""
    found = []
    for _, group in groupby(chain.from_iterable(map(batch_rows, batches)), key=itemgetter(*key)):
        found += decide(group)
        if len(found) >= ROWS_PER_BATCH:
            yield pa.RecordBatch.from_pylist(found, schema=out)
            found = []
    yield pa.RecordBatch.from_pylist(found, schema=out)


def _raw_rows(decide: Callable[[Iterator[dict]], list[tuple[str, RawFinding] | None]]):
    """`decide`, its (connection_id, RawFinding) findings as ACROSS_RAW rows."""
    def rows(group: Iterator[dict]) -> list[dict]:
        return [{"connection_id": connection_id, "channel": raw.channel, "incarnation": raw.incarnation,
                 "message_identity": raw.message_identity, "first_ts_ns": raw.first_ts_ns, **finding_fields(raw)}
                for connection_id, raw in filter(None, decide(group))]
    return rows


def _with_connections(found: DataFrame, connections: DataFrame) -> DataFrame:
    """The raw findings with their connection's row, as the pass's (connection_pass.RAW_FINDINGS)."""
    return found.join(connection_rows(connections), on="connection_id", how="left")
