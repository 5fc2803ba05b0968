"""Per-channel timelines on Spark: frames in; deliveries, publishes, channels and violations out,
row for row what the reference state machine (analyzer/timeline) gives.

Two paths, one set of rules:
- Regular connections (most traffic: seen from the start, no capture gaps, no transactions,
  every ack and confirm naming something outstanding) take vectorised DataFrame transforms:
  incarnations.py, consumer.py, publisher.py, channels.py. No Python runs per row.
- The rest (mid-stream starts, gaps, transactions, basic.recover, protocol violations, frames the
  capture reordered) take the reference model itself, one connection per group (reference.py):
  those rules are subtle and such connections are few; running the reference keeps one
  implementation of each rule instead of a second, approximate one.
A connection is regular unless one of the checks below says otherwise; the checks look at the
vectorised results themselves (an ack whose tag was not settled by it, a confirm ahead of its
publish), so a wrong assumption sends the connection to the reference model instead of giving a
wrong row. tests/test_spark_timeline.py asserts both paths together equal the reference model on
random valid and invalid traffic.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.timeline import INPUT_COLUMNS
from analyzer.timeline.records import DEFAULT_OVERDUE_NS

from ..types import spark_schema
from . import consumer, publisher
from .channels import channel_facts
from .incarnations import INCARNATION, channel_rows, connection_facts, incarnation_ends
from .plans import lookup, materialised
from .reference import reference_timelines
from .tables import TIMELINE_TABLES

# Whole-connection conditions the vectorised rules do not cover.
IRREGULAR_METHODS = ("capture.gap", "capture.midstream", "basic.recover", "basic.recover-async",
                     "tx.select", "tx.select-ok", "tx.commit", "tx.commit-ok", "tx.rollback", "tx.rollback-ok")
END_COLUMNS = ("agent_id", "open_seq", "end_seq", "end_ts_ns", "cutoff_seq", "ended_by", "end_outcome",
               "observed_until_ts_ns")
DELIVERY_COLUMNS = ("seq", "ts_ns", "method", "delivery_tag", "exchange", "routing_key", "message_id",
                    "message_identity", "redelivered", "x_death_count")


def timelines(frames: DataFrame, overdue_ns: int = DEFAULT_OVERDUE_NS) -> dict[str, DataFrame]:
    """The four timeline tables (TIMELINE_TABLES) for `frames` (schema.FRAMES or INPUT_COLUMNS)."""
    return routed_timelines(frames, overdue_ns)[0]


def routed_timelines(frames: DataFrame, overdue_ns: int = DEFAULT_OVERDUE_NS) -> tuple[dict[str, DataFrame], DataFrame]:
    """The four tables, and the connection_id of every connection the reference model replayed."""
    frames = frames.select(*INPUT_COLUMNS)
    fast, irregular = _vectorised(frames, overdue_ns)
    # Small tables (one row per connection, or per incarnation) are broadcast: a checkpointed
    # table has no size estimate, so the planner would shuffle and sort the big side to join them.
    slow = reference_timelines(frames.join(F.broadcast(irregular), on="connection_id", how="left_semi"), overdue_ns)
    return {name: (fast[name].join(F.broadcast(irregular), on="connection_id", how="left_anti").unionByName(slow[name])
                   .select(*[f.name for f in table_schema]))  # a USING join puts its key first
            for name, table_schema in TIMELINE_TABLES.items()}, irregular


def _vectorised(frames: DataFrame, overdue_ns: int) -> tuple[dict[str, DataFrame], DataFrame]:
    method = F.col("method")
    static = frames.where(method.isin(*IRREGULAR_METHODS) | F.coalesce(F.col("malformed"), F.lit(False))
                          | ((F.col("direction") == "to_client") & (method == "channel.close")
                             & F.col("failing_method").isin(*consumer.SETTLE_METHODS))).select("connection_id")
    candidates = frames.join(F.broadcast(static.distinct()), on="connection_id", how="left_anti")
    connections = connection_facts(candidates)
    ordered = channel_rows(candidates).transform(materialised)
    ends = incarnation_ends(ordered, connections).transform(materialised)
    life = lookup(ends.select(*INCARNATION, *END_COLUMNS).join(consumer.prefetch_at_cutoff(ordered, ends),
                                                                on=INCARNATION, how="left"))
    # Read by a dozen steps below: computed once.
    rows = consumer.with_prefetch(ordered.where(F.col("incarnation") > 0).drop("agent_id")
                                  .join(life, on=INCARNATION, how="inner")).transform(materialised)

    # Consumer side.
    delivered = consumer.deliveries(rows)
    delivered = delivered.select(*INCARNATION, *DELIVERY_COLUMNS, *END_COLUMNS, "consumer_tag", "queue", "no_ack",
                                 "consumer_prefetch", "channel_prefetch", "manual")
    settle = consumer.settles(rows)
    settler = consumer.first_settler(delivered.where(F.col("manual")), settle)
    delivered = (delivered.join(settler.withColumnRenamed("tag", "delivery_tag"),
                                on=[*INCARNATION, "delivery_tag"], how="left")
                 .transform(materialised))
    deliveries = consumer.settled_deliveries(delivered)

    # Publisher side.
    selects = lookup(publisher.confirm_selects(rows))
    published = publisher.publishes(rows, selects)
    confirm = publisher.confirms(rows, selects, published)
    confirmer = publisher.first_confirm(published, confirm)
    published = published.join(confirmer, on=[*INCARNATION, "confirm_seq"], how="left")
    numbered = publisher.waiting_and_overtaking(published.where(F.col("numbered")))
    published = (published.where(~F.col("numbered")).withColumn("pending_before", F.lit(None).cast("long"))
                 .withColumn("out_of_order_by", F.lit(None).cast("long"))
                 .unionByName(numbered)).transform(materialised)
    returned, bad_returns = publisher.returns(rows, published)
    publishes = publisher.settled_publishes(
        published.join(returned, on=[*INCARNATION, "seq"], how="left"), overdue_ns)

    channels = channel_facts(ends, rows, delivered, published, selects)

    irregular = (static
                 .unionByName(ordered.where(F.col("bad_order")).select("connection_id"))
                 .unionByName(ends.where(F.col("bad_end")).select("connection_id"))
                 .unionByName(delivered.where(F.col("no_ack").isNull()).select("connection_id"))
                 .unionByName(consumer.bad_settles(settle, delivered))
                 .unionByName(consumer.bad_gets(rows))
                 .unionByName(selects.where(F.col("unaligned")).select("connection_id"))
                 .unionByName(publisher.bad_confirms(confirm))
                 .unionByName(bad_returns)
                 .distinct()
                 .transform(materialised))
    tables = {
        "deliveries": _delivery_table(deliveries),
        "publishes": _publish_table(publishes),
        "channels": _conform(channels, "channels"),
        "violations": _conform(frames.sparkSession.createDataFrame([], spark_schema(TIMELINE_TABLES["violations"])),
                               "violations"),
    }
    return tables, irregular


def _delivery_table(deliveries: DataFrame) -> DataFrame:
    return _conform(deliveries.withColumn("channel_open_seq", F.col("open_seq"))
                    .withColumn("observed_until_ts_ns", F.col("delivery_observed_until")), "deliveries")


def _publish_table(publishes: DataFrame) -> DataFrame:
    persistent = F.when(F.col("delivery_mode").isNotNull(), F.col("delivery_mode") == 2) \
        .when(F.col("body_size").isNotNull(), F.lit(False))
    return _conform(publishes.withColumn("channel_open_seq", F.col("open_seq"))
                    .withColumn("persistent", persistent)
                    .withColumn("observed_until_ts_ns", F.col("publish_observed_until")), "publishes")


def _conform(df: DataFrame, name: str) -> DataFrame:
    """The table's exact columns and types; `ts`-like columns and `date` derived from the `_ns` ones."""
    struct = spark_schema(TIMELINE_TABLES[name])
    derived = {f.name: f.name + "_ns" for f in struct if f.name + "_ns" in struct.names}
    date_from = {"channels": "open_ts_ns"}.get(name, "ts_ns")
    columns = []
    for field in struct:
        if field.name == "date":
            column = F.date_format(_micros(date_from), "yyyy-MM-dd")
        elif field.name in derived:
            column = _micros(derived[field.name])
        else:
            column = F.col(field.name)
        columns.append(column.cast(field.dataType).alias(field.name))
    return df.select(*columns)


def _micros(ns_column: str):
    """A timestamp from nanoseconds, truncated as the agent does (integer division: a double
    would round nanosecond epochs)."""
    return F.timestamp_micros(F.expr(f"`{ns_column}` div 1000"))

