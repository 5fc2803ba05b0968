"""One row per channel incarnation (timeline.tables.CHANNELS) for the vectorised path."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from . import consumer
from .incarnations import INCARNATION


def channel_facts(ends: DataFrame, rows: DataFrame, delivered: DataFrame, published: DataFrame,
                  selects: DataFrame) -> DataFrame:
    consume = consumer.consumes(rows)
    unbounded = (F.coalesce(F.col("no_ack"), F.lit(False)) == False) & (F.col("consumer_prefetch_now") == 0) \
        & (F.col("channel_prefetch_now") == 0)  # noqa: E712
    consumed = consume.groupBy(*INCARNATION).agg(
        F.count("*").alias("consumes"), F.count(F.when(unbounded, 1)).alias("unbounded_manual_consumes"))
    # The last row's limits: qos after the cutoff never changed them.
    prefetch = rows.groupBy(*INCARNATION).agg(
        F.max_by("consumer_prefetch_now", "seq").alias("consumer_prefetch"),
        F.max_by("channel_prefetch_now", "seq").alias("channel_prefetch"))
    counts = [
        delivered.groupBy(*INCARNATION).agg(F.count("*").alias("deliveries")),
        published.groupBy(*INCARNATION).agg(F.count("*").alias("publishes")),
        consumer.peak_unacked(delivered),
        consumed,
        prefetch,
        selects.select(*INCARNATION, F.col("select_seq").isNotNull().alias("confirm_mode")),
    ]
    facts = ends
    for table in counts:
        facts = facts.join(table, on=INCARNATION, how="left")
    zero = F.lit(0).cast("long")
    return facts.select(
        *INCARNATION, "agent_id", "open_seq", "open_ts_ns",
        F.lit(True).alias("history_known"), F.lit(False).alias("gap_seen"),
        "end_seq", "end_ts_ns", "ended_by", "closed_by", "close_code", "close_text", "failing_method",
        F.coalesce(F.col("confirm_mode"), F.lit(False)).alias("confirm_mode"), F.lit(False).alias("tx_mode"),
        F.coalesce(F.col("consumer_prefetch"), F.lit(0)).alias("consumer_prefetch"),
        F.coalesce(F.col("channel_prefetch"), F.lit(0)).alias("channel_prefetch"),
        *[F.coalesce(F.col(c), zero).alias(c) for c in
          ("consumes", "unbounded_manual_consumes", "deliveries", "publishes", "peak_unacked")],
        "observed_until_ts_ns",
    )
