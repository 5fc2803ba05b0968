"""channel_metrics: per channel incarnation and time bucket, the numbers a dashboard plots.

Deliveries, publishes and channels (the timeline tables) in; one row per (incarnation, bucket) out,
`schema.CHANNEL_METRICS` (its comments define every column). Pure DataFrame transforms, no joins:

- Everything that happens becomes an event (delivery, settle, publish, confirm, open, end) with
  +1/-1 for what it adds to or takes from the outstanding sets; running sums per incarnation in
  (ts_ns, seq) order are the unacked and unconfirmed counts after each row.
- The oldest outstanding item at instant T is the first item, in arrival order, settled at or
  after T. It is also the first whose running-max settle time is >= T, which is monotone in arrival
  order: so it is found by sorting those running maxima together with the bucket ends and taking,
  for each bucket end, the next item (a window, not a self-join; rows per channel stay O(n)).
- Rows exist only for buckets where something happened, plus the buckets in between while
  something is outstanding: a channel idle for days costs nothing.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.timeline import records as r

from .timeline.blocks import running_in_blocks, same_keys
from .timeline.plans import lookup, materialised
from .types import spark_schema

KEY = ["connection_id", "agent_id", "channel", "incarnation"]
NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
NEVER = 2**63 - 1  # settle time of what is still outstanding when the data ends

DELIVERY_COUNTS = ("deliveries", "redeliveries", "deliveries_unknown", "acks", "nacks", "rejects", "requeues")
PUBLISH_COUNTS = ("publishes", "returns", "publishes_unknown", "confirms", "confirm_nacks", "lost")
COUNTS = DELIVERY_COUNTS + PUBLISH_COUNTS
LEVELS = ("unacked", "unconfirmed")


def channel_metrics(deliveries: DataFrame, publishes: DataFrame, channels: DataFrame,
                    bucket_seconds: int = 10) -> DataFrame:
    """Metrics per (connection_id, agent_id, channel, incarnation, bucket_start): schema.CHANNEL_METRICS."""
    if not isinstance(bucket_seconds, int) or bucket_seconds < 1:
        raise ValueError(f"bucket_seconds must be a whole number of seconds >= 1, not {bucket_seconds!r}")
    bucket_ns = bucket_seconds * NS_PER_SECOND
    events = _events(deliveries, publishes, channels)
    buckets = materialised(_per_bucket(events, bucket_ns))  # read by each _oldest, twice
    buckets = _oldest(buckets, _unacked_items(deliveries), "unacked", bucket_ns)
    buckets = _oldest(buckets, _unconfirmed_items(publishes), "unconfirmed", bucket_ns)
    return _contract(_with_idle_buckets(buckets, bucket_ns), bucket_seconds, bucket_ns)


# -- what counts as outstanding ------------------------------------------------------------------------

def _unacked() -> Column:
    """Manual-ack deliveries whose outcome is known: unknown ones (a gap, a missed open) cannot say
    how long they stayed unacked, so they never count (never "unacked forever")."""
    return F.coalesce(F.col("no_ack") == F.lit(False), F.lit(False)) & (F.col("outcome") != F.lit(r.UNKNOWN))


def _unconfirmed() -> Column:
    """Confirm-mode publishes whose outcome is known (acked, nacked, lost, or still open)."""
    return (F.col("mode") == F.lit(r.CONFIRM)) & (F.col("outcome") != F.lit(r.UNKNOWN))


def _settle_at() -> tuple[Column, Column]:
    """(ts, seq) an item stops being outstanding: its settle row, never before its own row."""
    early = F.col("settle_ts_ns") < F.col("ts_ns")
    return (F.when(early, F.col("ts_ns")).otherwise(F.col("settle_ts_ns")),
            F.when(early, F.col("seq")).otherwise(F.col("settle_seq")))


def _unacked_items(deliveries: DataFrame) -> DataFrame:
    settle_ts, _ = _settle_at()
    return deliveries.where(_unacked()).select(
        *KEY, "ts_ns", "seq", F.coalesce(settle_ts, F.lit(NEVER)).alias("settle_ts_ns"))


def _unconfirmed_items(publishes: DataFrame) -> DataFrame:
    settle_ts, _ = _settle_at()
    return publishes.where(_unconfirmed()).select(
        *KEY, "ts_ns", "seq", F.coalesce(settle_ts, F.lit(NEVER)).alias("settle_ts_ns"))


# -- events --------------------------------------------------------------------------------------------

def _flag(condition: Column) -> Column:
    return F.when(condition, F.lit(1)).otherwise(F.lit(0))


def _events(deliveries: DataFrame, publishes: DataFrame, channels: DataFrame) -> DataFrame:
    """One row per thing that happened: KEY, t (ts_ns), s (seq), the +1/-1 of each level, the counts
    it adds to its bucket, the prefetch a basic.deliver shows, and the data's end."""
    settle_ts, settle_seq = _settle_at()
    outcome, requeued = F.col("outcome"), F.coalesce(F.col("requeue"), F.lit(False))
    unacked, unconfirmed = _flag(_unacked()), _flag(_unconfirmed())
    delivered = deliveries.select(
        *KEY, F.col("ts_ns").alias("t"), F.col("seq").alias("s"),
        unacked.alias("unacked"),
        F.lit(1).alias("deliveries"),
        _flag(F.coalesce(F.col("redelivered"), F.lit(False))).alias("redeliveries"),
        _flag(outcome == F.lit(r.UNKNOWN)).alias("deliveries_unknown"),
        F.when(F.col("method") == F.lit("basic.deliver"),
               F.struct("consumer_prefetch", "channel_prefetch")).alias("prefetch"))
    delivery_settled = deliveries.where(F.col("settle_ts_ns").isNotNull()).select(
        *KEY, settle_ts.alias("t"), settle_seq.alias("s"),
        (-unacked).alias("unacked"),
        _flag(outcome == F.lit(r.ACK)).alias("acks"),
        _flag(outcome == F.lit(r.NACK)).alias("nacks"),
        _flag(outcome == F.lit(r.REJECT)).alias("rejects"),
        _flag(outcome.isin(r.NACK, r.REJECT) & requeued).alias("requeues"))
    published = publishes.select(
        *KEY, F.col("ts_ns").alias("t"), F.col("seq").alias("s"),
        unconfirmed.alias("unconfirmed"),
        F.lit(1).alias("publishes"),
        _flag(F.col("return_seq").isNotNull()).alias("returns"),
        _flag(outcome == F.lit(r.UNKNOWN)).alias("publishes_unknown"))
    publish_settled = publishes.where(F.col("settle_ts_ns").isNotNull()).select(
        *KEY, settle_ts.alias("t"), settle_seq.alias("s"),
        (-unconfirmed).alias("unconfirmed"),
        _flag(outcome == F.lit(r.ACKED)).alias("confirms"),
        _flag(outcome == F.lit(r.NACKED)).alias("confirm_nacks"),
        _flag(outcome == F.lit(r.LOST)).alias("lost"))
    opened = channels.select(*KEY, F.col("open_ts_ns").alias("t"), F.col("open_seq").alias("s"))
    end_ts = F.coalesce(F.col("end_ts_ns"), F.col("observed_until_ts_ns"))
    ended = channels.where(end_ts.isNotNull()).select(
        *KEY, end_ts.alias("t"), F.coalesce(F.col("end_seq"), F.lit(NEVER)).alias("s"),
        F.col("observed_until_ts_ns").alias("observed_until"))
    events = delivered
    for part in (delivery_settled, published, publish_settled, opened, ended):
        events = events.unionByName(part, allowMissingColumns=True)
    return events.fillna(0, subset=[*LEVELS, *COUNTS])


# -- buckets -------------------------------------------------------------------------------------------

def _per_bucket(events: DataFrame, bucket_ns: int) -> DataFrame:
    """The buckets where something happened: counts, the levels at the end and their peaks.

    Levels are counted within each bucket (a window per bucket, so a hot channel is never one
    task's whole partition) and raised by what the buckets before it left outstanding."""
    bucketed = events.withColumn("bucket", F.col("t") - F.pmod(F.col("t"), F.lit(bucket_ns)))
    in_bucket = Window.partitionBy(*KEY, "bucket").orderBy("t", "s")  # RANGE frame: every event of a row at once
    order = F.struct("t", "s")
    levelled = bucketed.select(
        *KEY, "t", "s", *COUNTS, "prefetch", "observed_until", "bucket",
        *[F.sum(level).over(in_bucket).alias(level) for level in LEVELS])
    per_bucket = levelled.groupBy(*KEY, "bucket").agg(
        *[F.sum(count).alias(count) for count in COUNTS],
        *[F.max_by(level, order).alias(level + "_change") for level in LEVELS],
        *[F.max(level).alias(level + "_peak_change") for level in LEVELS],
        # max_by skips rows whose ordering is null: only basic.deliver rows carry a prefetch struct.
        F.max_by("prefetch", F.when(F.col("prefetch").isNotNull(), order)).alias("prefetch"),
        F.max("observed_until").alias("observed_until"))
    by_bucket = Window.partitionBy(*KEY).orderBy("bucket")
    so_far = by_bucket.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    earlier = by_bucket.rowsBetween(Window.unboundedPreceding, -1)
    started = per_bucket.select(
        "*", *[F.coalesce(F.sum(level + "_change").over(earlier), F.lit(0)).alias(level + "_start")
               for level in LEVELS])
    # What was outstanding when the bucket began counts towards its peak too.
    return started.select(
        *KEY, "bucket", *COUNTS,
        *[(F.col(level + "_start") + F.col(level + "_change")).alias(level) for level in LEVELS],
        "observed_until",
        *[(F.col(level + "_start") + F.greatest(F.col(level + "_peak_change"), F.lit(0))).alias(level + "_max")
          for level in LEVELS],
        F.last("prefetch", ignorenulls=True).over(so_far).alias("prefetch"),
        F.lead("bucket").over(by_bucket).alias("next_bucket"))


def _oldest(buckets: DataFrame, items: DataFrame, level: str, bucket_ns: int) -> DataFrame:
    """Adds oldest_<level>_ts_ns / _seq: the first item (arrival order) still outstanding at the end
    of each bucket, i.e. the first whose running-max settle time is >= the bucket end.

    That running maximum never falls, so an item is the answer for the bucket ends above the
    maximum before it, up to its own. Those bucket ends, spelled out (at most one row per bucket
    of the incarnation's span, as _with_idle_buckets makes anyway), meet the buckets in an
    equi-join; the maxima are counted per arrival bucket (timeline.blocks), never over a hot
    channel's millions of items in one task."""
    def end_index(ns: str) -> Column:
        """k of the bucket end k * bucket_ns at or before the instant (integer division: ns are too
        big for a double to divide exactly)."""
        return F.expr(f"`{ns}` div {bucket_ns}")

    span = lookup(buckets.groupBy(*KEY).agg(F.min("bucket").alias("_first_bucket"),
                                            F.max("bucket").alias("_last_bucket"))
                  .select(*[F.col(key).alias(f"_span_{key}") for key in KEY],
                          (end_index("_first_bucket") + 1).alias("_first"),
                          (end_index("_last_bucket") + 1).alias("_last")))
    settle = F.col("settle_ts_ns")
    arrival_bucket = F.col("ts_ns") - F.pmod(F.col("ts_ns"), F.lit(bucket_ns))
    reached = running_in_blocks(items, KEY, ["ts_ns", "seq"], arrival_bucket,
                                maxes={"_upto": (settle, True), "_before": (settle, False)})
    low = F.when(F.col("_before").isNull(), F.col("_first")).otherwise(
        F.greatest(end_index("_before") + 1, F.col("_first")))
    high = F.least(end_index("_upto"), F.col("_last"))
    answers = (reached.join(span, on=same_keys(KEY, "_span_"), how="inner")
               .select(*[F.col(key).alias(f"_answer_{key}") for key in KEY], F.struct("ts_ns", "seq").alias("_next"),
                       low.alias("_low"), high.alias("_high"))
               .where(F.col("_low") <= F.col("_high"))
               .select("*", F.explode(F.sequence("_low", "_high")).alias("_answer__end")))
    outstanding = F.col(level) > F.lit(0)
    return (buckets.withColumn("_end", end_index("bucket") + 1)
            .join(answers, on=same_keys([*KEY, "_end"], "_answer_"), how="left")
            .select(*buckets.columns,
                    F.when(outstanding, F.col("_next.ts_ns")).alias(f"oldest_{level}_ts_ns"),
                    F.when(outstanding, F.col("_next.seq")).alias(f"oldest_{level}_seq")))


def _with_idle_buckets(buckets: DataFrame, bucket_ns: int) -> DataFrame:
    """Each bucket with something outstanding at its end is followed by the quiet buckets up to the
    next bucket with an event: same levels, nothing counted."""
    outstanding = (F.col("unacked") > F.lit(0)) | (F.col("unconfirmed") > F.lit(0))
    last = F.when(outstanding & F.col("next_bucket").isNotNull(),
                  F.col("next_bucket") - F.lit(bucket_ns)).otherwise(F.col("bucket"))
    exploded = buckets.select(
        "*", F.posexplode(F.sequence(F.col("bucket"), last, F.lit(bucket_ns))).alias("_idle", "bucket_start_ns"))
    idle = F.col("_idle") > F.lit(0)
    return exploded.select(
        *KEY, "bucket_start_ns", "prefetch", *LEVELS,
        *[F.when(idle, F.lit(0)).otherwise(F.col(count)).alias(count) for count in COUNTS],
        *[F.when(idle, F.col(level)).otherwise(F.col(level + "_max")).alias(level + "_max") for level in LEVELS],
        *[F.col(f"oldest_{level}_{part}") for level in LEVELS for part in ("ts_ns", "seq")],
        F.when(idle, F.lit(None)).otherwise(F.col("observed_until")).alias("observed_until"))


def _contract(rows: DataFrame, bucket_seconds: int, bucket_ns: int) -> DataFrame:
    start = F.col("bucket_start_ns")
    end = start + F.lit(bucket_ns)
    # The end-of-bucket values describe the bucket's end, or the data's end if it falls inside it.
    as_of = F.least(end, F.coalesce(F.col("observed_until"), end))
    ages = {level: as_of - F.col(f"oldest_{level}_ts_ns") for level in LEVELS}
    columns = {
        "date": F.date_from_unix_date(F.expr(f"bucket_start_ns div {NS_PER_DAY}").cast("int")).cast("string"),
        "bucket_start": F.timestamp_micros(F.expr("bucket_start_ns div 1000")),
        "bucket_seconds": F.lit(bucket_seconds),
        "as_of_ns": as_of,
        "oldest_unacked_age_ns": ages["unacked"],
        "oldest_unconfirmed_age_ns": ages["unconfirmed"],
        "consumer_prefetch": F.col("prefetch.consumer_prefetch"),
        "channel_prefetch": F.col("prefetch.channel_prefetch"),
    }
    shaped = rows.select(*[name for name in rows.columns if name not in columns],
                         *[column.alias(name) for name, column in columns.items()])
    # The schema contract: its columns, in its order and types (a cast only where the type differs:
    # each is several JVM round trips).
    types = {field.name: field.dataType for field in shaped.schema}
    return shaped.select(*[f.name if types[f.name] == f.dataType else F.col(f.name).cast(f.dataType).alias(f.name)
                           for f in spark_schema(schema.CHANNEL_METRICS)])
