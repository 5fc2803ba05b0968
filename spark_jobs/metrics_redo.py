"""channel_metrics again, from all its records, for a connection whose frame times went back: the
pass streams metric rows out as their buckets become final, and a frame older than a bucket
already out would change it (analyzer/timeline/metrics.py raises HorizonError rather than write a
wrong row). Rare (merged captures, a clock stepped back), so it is a second, small grouped call
over the records the pass wrote, only for those connections: from its wide table, or from the
files it wrote itself (the analysis job's pass, connection_pass's `write_to`).
"""

from __future__ import annotations

from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.timeline.carry import load
from analyzer.timeline.metrics import channel_metrics, to_table
from analyzer.timeline.tables import RECORD_TYPES

from .connection_pass import STATE_TABLE, PassSummary
from .provisional import flagged, metric_flags, open_buckets
from .timeline.plans import materialised
from .timeline.tables import CHANNEL_METRICS, TIMELINE_TABLES
from .timeline.wide import RECORD, as_wide, column, from_wide, records_from_wide
from .types import spark_schema
from .wide_writes import read_written

# The records channel_metrics reads.
METRIC_RECORDS = ("deliveries", "publishes", "channels")


def pass_channel_metrics(wide: DataFrame, summary: PassSummary, bucket_seconds: int,
                         written_to: str | None = None) -> DataFrame:
    """The channel_metrics of the pass's (materialised) wide table: as streamed, except for the
    connections in `summary.metrics_redo`, computed again."""
    metrics = from_wide(with_metrics_redone(wide, summary, bucket_seconds, written_to), "channel_metrics",
                        CHANNEL_METRICS)
    return materialised(metrics) if summary.metrics_redo else metrics


def with_metrics_redone(wide: DataFrame, summary: PassSummary, bucket_seconds: int,
                        written_to: str | None = None) -> DataFrame:
    """The pass's (materialised) wide table, the channel_metrics rows of the connections in
    `summary.metrics_redo` computed again (the other rows as they are). `written_to`: the lake the
    pass wrote its timeline tables to itself (`summary.written` names the files), if it did."""
    redo = summary.metrics_redo
    if not redo:
        return wide
    streamed = ~((F.col(RECORD) == "channel_metrics") & column("channel_metrics", "connection_id").isin(*redo))
    records = wide if written_to is None else wide.unionByName(
        _written_records(wide, written_to, summary.written, redo))
    return wide.where(streamed).unionByName(as_wide(metrics_again(records, redo, bucket_seconds), "channel_metrics",
                                                    wide.schema))


def _written_records(wide: DataFrame, lake: str, adds: dict[str, list[AddAction]],
                     connection_ids: list[str]) -> DataFrame:
    """The records channel_metrics reads of these connections, from the files the pass wrote into
    `lake` (`adds`, not committed yet), as rows of the wide table."""
    parts = [as_wide(read_written(wide.sparkSession, lake, name, adds[name], TIMELINE_TABLES[name])
                     .where(F.col("connection_id").isin(*connection_ids)), name, wide.schema)
             for name in METRIC_RECORDS if name in adds]
    return reduce(DataFrame.unionByName, parts) if parts else wide.limit(0)


def metrics_again(wide: DataFrame, connection_ids: list[str], bucket_seconds: int) -> DataFrame:
    """Stored channel_metrics rows of these connections, from the pass's wide table (its records,
    and its checkpoint for which rows are provisional)."""
    owner = F.coalesce(*[column(name, "connection_id") for name in (*METRIC_RECORDS, STATE_TABLE)])
    rows = (wide.where(F.col(RECORD).isin(*METRIC_RECORDS, STATE_TABLE)).withColumn("_connection", owner)
            .where(F.col("_connection").isin(*connection_ids)))

    def one_connection(records: pa.Table) -> pa.Table:
        metrics = channel_metrics(_records(records), bucket_seconds)
        return flagged(to_table(metrics), metric_flags(metrics, _open_buckets(records)))

    return rows.groupBy("_connection").applyInArrow(one_connection, spark_schema(CHANNEL_METRICS))


def _records(wide: pa.Table) -> list:
    return [x for name in METRIC_RECORDS for x in records_from_wide(wide, name, RECORD_TYPES[name])]


def _open_buckets(wide: pa.Table) -> dict[str, tuple]:
    """provisional.open_buckets of the connection's checkpoint (its analysis_state row of the wide
    table), if it has one."""
    state = wide.filter(pc.equal(wide.column(RECORD), STATE_TABLE)).to_pylist()
    if not state or state[0][STATE_TABLE]["checkpoint"] is None:
        return {}
    row = state[0][STATE_TABLE]
    return {row["connection_id"]: open_buckets(load(row["checkpoint"]))}
