"""channel_metrics again, from all its records, for a connection whose frame times went back: the
pass streams metric rows out as their buckets become final, and a frame older than a bucket
already out would change it (analyzer/timeline/metrics.py raises HorizonError rather than write a
wrong row). Rare (merged captures, a clock stepped back), so it is a second, small grouped call
over the records the pass wrote, only for those connections.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.timeline.carry import load
from analyzer.timeline.metrics import channel_metrics, to_table
from analyzer.timeline.tables import RECORD_TYPES

from .connection_pass import STATE_TABLE
from .provisional import flagged, metric_flags, open_buckets
from .timeline.plans import materialised
from .timeline.tables import CHANNEL_METRICS
from .timeline.wide import RECORD, as_wide, column, from_wide, records_from_wide
from .types import spark_schema

# The records channel_metrics reads.
METRIC_RECORDS = ("deliveries", "publishes", "channels")


def pass_channel_metrics(wide: DataFrame, redo: list[str], bucket_seconds: int) -> DataFrame:
    """The channel_metrics of the pass's (materialised) wide table: as streamed, except for the
    connections in `redo` (connection_pass.PassSummary.metrics_redo), computed again."""
    metrics = from_wide(with_metrics_redone(wide, redo, bucket_seconds), "channel_metrics", CHANNEL_METRICS)
    return materialised(metrics) if redo else metrics


def with_metrics_redone(wide: DataFrame, redo: list[str], bucket_seconds: int) -> DataFrame:
    """The pass's (materialised) wide table, the channel_metrics rows of the connections in `redo`
    computed again (the other rows as they are)."""
    if not redo:
        return wide
    streamed = ~((F.col(RECORD) == "channel_metrics") & column("channel_metrics", "connection_id").isin(*redo))
    return wide.where(streamed).unionByName(as_wide(metrics_again(wide, redo, bucket_seconds), "channel_metrics",
                                                    wide.schema))


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
