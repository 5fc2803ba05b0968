"""The consumer side as columns: deliveries, what settled each (settling.py), and the checks that
the client acked only what was outstanding (where it did not, the connection goes to the
reference model).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .blocks import running_in_blocks, seq_block
from .incarnations import INCARNATION, TO_BROKER, TO_CLIENT, running
from .plans import lookup
from .settling import first_settling_frame

SETTLE_METHODS = {"basic.ack": "ack", "basic.nack": "nack", "basic.reject": "reject"}


def prefetch_at_cutoff(ordered: DataFrame, ends: DataFrame) -> DataFrame:
    """Per incarnation: the prefetch of each kind the last basic.qos before the cutoff set (null if
    none), which rows after the cutoff still see: qos after it is discarded."""
    qos = (ordered.where((F.col("incarnation") > 0) & (F.col("method") == "basic.qos")
                         & (F.col("direction") == TO_BROKER) & F.col("prefetch_count").isNotNull())
           .join(ends.select(*INCARNATION, "cutoff_seq"), on=INCARNATION, how="inner")
           .where(F.col("seq") < F.col("cutoff_seq")))
    per_channel = F.coalesce(F.col("prefetch_global"), F.lit(False))
    return qos.groupBy(*INCARNATION).agg(
        F.max_by(F.when(~per_channel, F.col("prefetch_count")), F.when(~per_channel, F.col("seq")))
        .alias("consumer_prefetch_at_cutoff"),
        F.max_by(F.when(per_channel, F.col("prefetch_count")), F.when(per_channel, F.col("seq")))
        .alias("channel_prefetch_at_cutoff"))


def with_prefetch(rows: DataFrame) -> DataFrame:
    """Every row with the basic.qos limits in force at it (0 unlimited: the channel was seen whole)
    and the highest delivery tag so far; qos after the cutoff is discarded.

    From channel_rows' running values (`consumer_qos`, `channel_qos`, `last_delivery`) and the
    incarnation's prefetch_at_cutoff: no window of its own. Tags rise in a regular incarnation, so
    the latest delivery's tag is the highest."""
    def now(latest: str, at_cutoff: str):
        return F.coalesce(F.when(F.col(f"{latest}.at") >= F.col("cutoff_seq"), F.col(at_cutoff))
                          .otherwise(F.col(f"{latest}.value")), F.lit(0))

    return rows.withColumns({
        "consumer_prefetch_now": now("consumer_qos", "consumer_prefetch_at_cutoff"),
        "channel_prefetch_now": now("channel_qos", "channel_prefetch_at_cutoff"),
        "max_tag_so_far": F.col("last_delivery.value"),
    })


def consumes(rows: DataFrame) -> DataFrame:
    """basic.consume rows the channel acted on (before its cutoff)."""
    return rows.where((F.col("method") == "basic.consume") & (F.col("direction") == TO_BROKER)
                      & (F.col("seq") < F.col("cutoff_seq")))


def registrations(rows: DataFrame) -> DataFrame:
    """Consumer tag -> (queue, no_ack, consumer prefetch at its consume), from the row on: a
    nowait consume naming its tag at once, any other at the consume-ok right after it."""
    consume = consumes(rows).withColumn("no_ack", F.coalesce("no_ack", F.lit(False)))
    at_once = F.coalesce(F.col("nowait"), F.lit(False)) & (F.coalesce(F.col("consumer_tag"), F.lit("")) != "")
    immediate = consume.where(at_once).select(
        *INCARNATION, "seq", "consumer_tag", "queue", "no_ack", F.col("consumer_prefetch_now").alias("prefetch"))
    pending = consume.where(~at_once).select(
        *INCARNATION, "seq", F.lit(True).alias("is_consume"), F.lit(None).cast("string").alias("consumer_tag"),
        "queue", "no_ack", F.col("consumer_prefetch_now").alias("prefetch"))
    oks = rows.where((F.col("method") == "basic.consume-ok") & (F.col("direction") == TO_CLIENT)).select(
        *INCARNATION, "seq", F.lit(False).alias("is_consume"), "consumer_tag",
        F.lit(None).cast("string").alias("queue"), F.lit(None).cast("boolean").alias("no_ack"),
        F.lit(None).cast("int").alias("prefetch"))
    earlier = running(*INCARNATION).rowsBetween(Window.unboundedPreceding, -1)
    # The reference keeps one pending consume: a consume-ok takes it only if a consume came last.
    paired = (pending.unionByName(oks)
              .withColumn("before", F.last(F.struct("is_consume", "queue", "no_ack", "prefetch")).over(earlier))
              .where(~F.col("is_consume") & F.col("before.is_consume") & F.col("consumer_tag").isNotNull())
              .select(*INCARNATION, "seq", "consumer_tag", F.col("before.queue").alias("queue"),
                      F.col("before.no_ack").alias("no_ack"), F.col("before.prefetch").alias("prefetch")))
    return immediate.unionByName(paired)


def _answered_get():
    """For a basic.get-ok row: was the basic.get it answers pending (channel_rows' `previous_get_row`:
    the last get, get-ok or get-empty before it in this incarnation, a get the channel acted on)?"""
    before = F.col("previous_get_row")
    return before.isNotNull() & F.col("previous_get_row.value.is_get") \
        & (F.col("previous_get_row.at") < F.col("cutoff_seq"))


def bad_gets(rows: DataFrame) -> DataFrame:
    """Connections where a basic.get-ok comes right after a basic.get sent after the cutoff: the
    channel ignored that get, so the answer pairs with an earlier one (the reference model's case)."""
    return rows.where((F.col("method") == "basic.get-ok") & F.col("previous_get_row.value.is_get")
                      & (F.col("previous_get_row.at") >= F.col("cutoff_seq"))).select("connection_id")


def deliveries(rows: DataFrame) -> DataFrame:
    """Every delivery with its consumer's (or get's) queue, ack mode and prefetch; `manual` marks
    those the client must settle (no_ack false, delivered before the cutoff).

    A delivery's consumer is the latest registration of its consumer tag before it: registrations
    are few, so each becomes a span (until the tag's next registration) and the deliveries find
    theirs in a join (broadcast when the spans are few: plans.lookup), not a window over the deliveries."""
    delivered = rows.where(F.col("is_delivery"))
    spans = lookup(registrations(rows).select(
        *[F.col(c).alias("reg_" + c) for c in (*INCARNATION, "consumer_tag")],
        F.col("seq").alias("reg_seq"),
        F.lead("seq").over(Window.partitionBy(*INCARNATION, "consumer_tag").orderBy("seq")).alias("reg_until"),
        F.struct("queue", "no_ack", "prefetch").alias("reg")))
    in_span = [F.col(c) == F.col("reg_" + c) for c in (*INCARNATION, "consumer_tag")] + [
        F.col("reg_seq") < F.col("seq"), F.col("reg_until").isNull() | (F.col("seq") < F.col("reg_until"))]
    deliver = F.col("method") == "basic.deliver"
    got = _answered_get()
    return (delivered.join(spans, on=in_span, how="left")
            .select(*[c for c in delivered.columns if c not in ("queue", "no_ack", "consumer_tag")],
                    F.when(deliver, F.col("consumer_tag")).alias("consumer_tag"),
                    F.when(deliver, F.col("reg.queue")).when(got, F.col("previous_get_row.value.queue"))
                    .alias("queue"),
                    F.when(deliver, F.col("reg.no_ack")).when(got, F.col("previous_get_row.value.no_ack"))
                    .alias("no_ack"),
                    F.when(deliver, F.col("reg.prefetch")).alias("consumer_prefetch"),
                    F.when(deliver, F.col("channel_prefetch_now")).alias("channel_prefetch"))
            .withColumn("manual", (F.col("no_ack") == False) & (F.col("seq") < F.col("cutoff_seq"))))  # noqa: E712


def settles(rows: DataFrame) -> DataFrame:
    """The client's basic.ack/nack/reject the channel acted on, with each one's reach if multiple."""
    method = F.col("method")
    multiple = F.coalesce(F.col("multiple"), F.lit(False)) & (method != "basic.reject")
    reach = F.when(F.col("delivery_tag") == 0, F.col("max_tag_so_far")) \
        .otherwise(F.least(F.col("delivery_tag"), F.col("max_tag_so_far")))
    return (rows.where(method.isin(*SETTLE_METHODS) & (F.col("direction") == TO_BROKER)
                       & F.col("delivery_tag").isNotNull() & (F.col("seq") < F.col("cutoff_seq")))
            .select(*INCARNATION, "seq", "ts_ns", "method", "delivery_tag", multiple.alias("multiple"),
                    F.when(method != "basic.ack", F.col("requeue")).alias("requeue"),
                    F.when(multiple, F.coalesce(reach, F.lit(0))).alias("reach")))


def first_settler(manual: DataFrame, settle: DataFrame) -> DataFrame:
    """(incarnation, tag) -> `settler`: the client's ack, nack or reject that settled the delivery."""
    items = manual.select(*INCARNATION, F.col("delivery_tag").alias("tag"), F.col("seq").alias("item_seq"))
    return (first_settling_frame(items, settle, "tag", ("seq", "ts_ns", "method", "delivery_tag", "multiple", "requeue"))
            .withColumnRenamed("frame", "settler"))


def bad_settles(settle: DataFrame, delivered: DataFrame) -> DataFrame:
    """Connections where an ack, nack or reject named a tag that was not outstanding when it came
    (double ack, unknown tag, another channel's tag, an auto-ack tag, or one the capture shows
    before its delivery): what follows depends on the broker's 406, the reference model's case."""
    named = settle.where(~(F.col("multiple") & (F.col("delivery_tag") == 0)))
    d = delivered.select(*INCARNATION, "delivery_tag", F.col("seq").alias("d_seq"), "manual",
                         F.col("settler.seq").alias("settler_seq"))
    return (named.join(d, on=[*INCARNATION, "delivery_tag"], how="left")
            .where(F.col("d_seq").isNull() | ~F.col("manual") | (F.col("settler_seq").isNull())
                   | (F.col("settler_seq") != F.col("seq")))
            .select("connection_id"))


def peak_unacked(delivered: DataFrame) -> DataFrame:
    """Per incarnation: the most manual-ack deliveries outstanding at once."""
    manual = delivered.where(F.col("manual"))
    events = (manual.select(*INCARNATION, "seq", F.lit(1).alias("step"))
              .unionByName(manual.where(F.col("settler").isNotNull())
                           .select(*INCARNATION, F.col("settler.seq").alias("seq"), F.lit(-1).alias("step"))))
    return (running_in_blocks(events, INCARNATION, ["seq", "step"], seq_block(), sums={"unacked": F.col("step")})
            .groupBy(*INCARNATION).agg(F.max("unacked").alias("peak_unacked")))


def settled_deliveries(delivered: DataFrame) -> DataFrame:
    """The deliveries table's outcome columns from the settler and the incarnation's end."""
    settled = F.col("settler").isNotNull()
    auto = F.col("no_ack") == True  # noqa: E712
    still_open = F.col("ended_by") == "end_of_data"
    end_is_later = F.col("end_seq") >= F.col("seq")
    outcome = F.lit(None).cast("string")
    for method, name in SETTLE_METHODS.items():
        outcome = F.when(F.col("settler.method") == method, F.lit(name)).otherwise(outcome)
    settle_seq = (F.when(auto, F.col("seq")).when(settled, F.col("settler.seq")).when(still_open, F.lit(None))
                  .otherwise(F.greatest("end_seq", "seq")))
    settle_ts = (F.when(auto, F.col("ts_ns")).when(settled, F.col("settler.ts_ns")).when(still_open, F.lit(None))
                 .when(end_is_later, F.col("end_ts_ns")).otherwise(F.col("ts_ns")))
    return delivered.select(
        "*",
        F.when(auto, F.lit("auto")).when(settled, outcome).when(still_open, F.lit("open"))
        .otherwise(F.col("end_outcome")).alias("outcome"),
        F.when(settled, F.col("settler.multiple")).alias("settled_by_multiple"),
        F.when(settled, F.col("settler.delivery_tag")).alias("settle_tag"),
        F.when(settled, F.col("settler.requeue")).alias("requeue"),
        F.when(settled, F.lit(False)).alias("in_tx"),
        F.when(settled, F.col("settler.seq")).alias("settle_frame_seq"),
        settle_seq.cast("long").alias("settle_seq"),
        settle_ts.cast("long").alias("settle_ts_ns"),
        (settle_ts - F.col("ts_ns")).cast("long").alias("settle_latency_ns"),
        F.when(~auto & ~settled & still_open, F.col("observed_until_ts_ns")).alias("delivery_observed_until"),
    )
