"""Consumer-side kinds, one finding per channel incarnation: unacked_buildup, unbounded_prefetch,
unknown_delivery_tag.

`deliveries` carries each delivery's outcome; `open` ones were still unacked when the data ended
(they age until `observed_until_ts_ns`), `unknown` ones (a capture gap, a consumer whose ack mode
the data does not show) are left out: how long they stayed unacked cannot be known.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.thresholds import Thresholds
from spark_jobs.timeline.blocks import running_in_blocks, same_keys, seq_block
from spark_jobs.timeline.plans import lookup, materialised

from .common import INCARNATION, MAX_EVIDENCE, evidence, firsts, incarnation_of, ranked, raw_finding, seconds

Tables = dict[str, DataFrame]

# Outcomes that end a delivery's unacked time, and those only the client's own frames give.
SETTLED = ("ack", "nack", "reject", "recovered", "channel_closed", "connection_closed")
SETTLED_BY_CLIENT = ("ack", "nack", "reject")


def manual_deliveries(deliveries: DataFrame) -> DataFrame:
    """Manual-ack deliveries with a known unacked time: `until_ns` (settled, or the end of the
    data for open ones) and `age_ns`. A consumer whose basic.consume the data lacks (no_ack null)
    counts as manual once the client acked, nacked or rejected one of its tags: an auto-ack
    delivery cannot be acked."""
    until = (F.when(F.col("outcome").isin(*SETTLED), F.col("settle_ts_ns"))
             .when(F.col("outcome") == "open", F.col("observed_until_ts_ns")))
    candidates = deliveries.filter(F.col("outcome").isin(*SETTLED, "open"))
    unknown_mode = candidates.filter(F.col("no_ack").isNull())
    consumer = [*INCARNATION, "consumer_tag"]  # a get-ok's consumer_tag is null: null matches null
    acked = (unknown_mode.filter(F.col("outcome").isin(*SETTLED_BY_CLIENT))
             .select(*[F.col(c).alias(f"_acked_{c}") for c in consumer]).distinct())
    guessed = unknown_mode.join(acked, on=same_keys(consumer, "_acked_"), how="left_semi")
    return (candidates.filter(F.col("no_ack") == False).unionByName(guessed)  # noqa: E712
            .withColumn("until_ns", until).filter(F.col("until_ns").isNotNull())
            .withColumn("age_ns", F.col("until_ns") - F.col("ts_ns")))


def _unacked_profile(manual: DataFrame) -> DataFrame:
    """Per incarnation: the computed peak of unacked deliveries and the longest time a scope sat at
    its prefetch limit with no ack (rows where unacked >= limit > 0, each lasting until the next
    row, the last until the end of the data).

    Each delivery is +1 at its row and -1 at its settlement, counted in scopes: `channel` (every
    manual delivery; the limit is the global basic.qos) and one per consumer that has a
    per-consumer limit (basic.get ignores prefetch, so only basic.deliver rows belong to one).
    Running values are counted in blocks of seq (timeline.blocks): a hot channel's millions of
    rows never sit in one task."""
    is_deliver = F.col("method") == "basic.deliver"
    scopes = F.array(
        F.struct(F.lit("channel").alias("name"), F.when(is_deliver, F.col("channel_prefetch")).alias("limit")),
        F.when(is_deliver & (F.col("consumer_prefetch") > 0), F.struct(
            F.concat(F.lit("consumer "), F.coalesce("consumer_tag", F.lit(""))).alias("name"),
            F.col("consumer_prefetch").alias("limit"))))
    steps = F.array(
        F.struct(F.col("seq").alias("at_seq"), F.col("ts_ns").alias("at_ns"), F.lit(1).alias("delta")),
        F.when(F.col("outcome").isin(*SETTLED), F.struct(
            F.coalesce("settle_seq", "seq").alias("at_seq"), F.col("settle_ts_ns").alias("at_ns"),
            F.lit(-1).alias("delta"))))
    events = (manual.select(*INCARNATION, "observed_until_ts_ns",
                            F.explode(F.array_compact(scopes)).alias("scope"), F.array_compact(steps).alias("steps"))
              .select(*INCARNATION, "observed_until_ts_ns", F.col("scope.name").alias("scope"),
                      F.col("scope.limit").alias("limit"), F.explode("steps").alias("step"))
              # Row order within a connection is seq; a settlement shown on its delivery's own row comes after it.
              .select(*INCARNATION, "observed_until_ts_ns", "scope", "limit", "step.*", (-F.col("step.delta"))
                      .alias("_settles_after")))
    scope = [*INCARNATION, "scope"]
    order = ["at_seq", "_settles_after"]
    whole = lookup(events.groupBy(*scope).agg(
        F.max("limit").alias("_limit"), F.max("observed_until_ts_ns").alias("_end_ns"),
        F.min_by("at_ns", F.struct(*order)).alias("_first_ns")))
    # Materialised: the second pass below reads its input twice (its blocks and their carries).
    counted = materialised(running_in_blocks(events, scope, order, seq_block("at_seq"),
                                             sums={"_unacked": F.col("delta")}, nexts={"_next_at": F.col("at_ns")})
                           .join(whole, on=scope, how="inner")
                           .withColumn("_full", F.coalesce((F.col("_limit") > 0)
                                                           & (F.col("_unacked") >= F.col("_limit")), F.lit(False))))
    # A run of full rows began at the row after the last row that was not full (its `_next_at`),
    # or at the scope's first row.
    events = running_in_blocks(counted, scope, order, seq_block("at_seq"),
                               lasts={"_after_not_full": (F.when(~F.col("_full"), F.col("_next_at")), False)})
    full_since = F.coalesce("_after_not_full", "_first_ns")
    next_ns = F.coalesce("_next_at", "_end_ns", "at_ns")
    stall_ns = F.when(F.col("_full"), next_ns - full_since)
    return events.groupBy(*INCARNATION).agg(
        F.max(F.when(F.col("scope") == "channel", F.col("_unacked"))).alias("computed_peak"),
        F.max(stall_ns).alias("stall_ns"),
        F.max_by(F.when(F.col("_full"), F.col("_limit")), stall_ns).alias("stall_limit"))


def unacked_buildup(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """A channel whose oldest manual-ack delivery stayed unacked past `unacked_age_seconds`, or
    that sat at its prefetch limit with no ack for `prefetch_stall_seconds`. Count: the most
    deliveries unacked at once on the channel."""
    age_limit_ns = int(thresholds.unacked_age_seconds * 1e9)
    stall_limit_ns = int(thresholds.prefetch_stall_seconds * 1e9)
    # Every step below works per incarnation (per consumer, per scope): shuffle the deliveries
    # once, by incarnation, and each later window and aggregation finds them in place.
    # Only the columns used below: every step sorts and checkpoints these rows.
    columns = [*INCARNATION, "agent_id", "seq", "ts_ns", "method", "delivery_tag", "consumer_tag", "no_ack",
               "outcome", "settle_seq", "settle_ts_ns", "observed_until_ts_ns", "channel_prefetch",
               "consumer_prefetch"]
    manual = manual_deliveries(tables["deliveries"].select(*columns))
    # The evidence is the deliveries at least as old as the threshold that fired: number them
    # in seq order, for each threshold, to list the first few of either.
    old_by_age, old_by_stall = F.col("age_ns") >= age_limit_ns, F.col("age_ns") >= stall_limit_ns
    manual = materialised(running_in_blocks(manual, INCARNATION, ["seq"], seq_block(), sums={
        "_age_rank": old_by_age.cast("int"), "_stall_rank": old_by_stall.cast("int")}))

    def old(condition, rank: str, name: str) -> list:
        listed = F.when(condition & (F.col(rank) <= MAX_EVIDENCE), F.struct("seq", "delivery_tag"))
        return [F.sort_array(F.collect_list(listed)).alias(f"{name}_items"),
                F.min(F.when(condition, F.col("ts_ns"))).alias(f"{name}_first_ns"),
                F.max(F.when(condition, F.col("until_ns"))).alias(f"{name}_last_ns")]

    oldest = manual.groupBy(*INCARNATION).agg(
        F.min("agent_id").alias("agent_id"),
        F.max("age_ns").alias("oldest_ns"),
        F.max_by(F.struct("delivery_tag", "seq"), "age_ns").alias("oldest"),
        *old(old_by_age, "_age_rank", "age"), *old(old_by_stall, "_stall_rank", "stall"))
    peaks = tables["channels"].select(*INCARNATION, "peak_unacked")
    found = (oldest.join(_unacked_profile(manual), on=INCARNATION, how="left")
             .join(peaks, on=INCARNATION, how="left")
             .withColumn("_by_age", F.col("oldest_ns") >= age_limit_ns)
             .withColumn("_by_stall", F.coalesce(F.col("stall_ns") >= stall_limit_ns, F.lit(False)))
             .filter(F.col("_by_age") | F.col("_by_stall")))
    # List what the threshold that fired takes in; if both fired, the lower one's (it takes in more).
    by_stall_list = ~F.col("_by_age") | (F.col("_by_stall") & F.lit(stall_limit_ns < age_limit_ns))

    def pick(suffix: str):
        return F.when(by_stall_list, F.col(f"stall_{suffix}")).otherwise(F.col(f"age_{suffix}"))

    peak = F.greatest(F.coalesce("peak_unacked", F.lit(0)), F.coalesce("computed_peak", F.lit(0)))
    oldest_s, stall_s = seconds(F.col("oldest_ns")), seconds(F.col("stall_ns"))
    stall_phrase = F.when(F.col("_by_stall"), F.format_string("; it sat at its prefetch limit of %d for %.1f s",
                                                              "stall_limit", stall_s))
    return raw_finding(
        found, "unacked_buildup",
        first_ts_ns=pick("first_ns"), last_ts_ns=pick("last_ns"), count=peak,
        value=F.when(F.col("_by_age"), oldest_s).otherwise(stall_s),
        threshold=F.when(F.col("_by_age"), F.lit(thresholds.unacked_age_seconds))
        .otherwise(F.lit(thresholds.prefetch_stall_seconds)),
        summary=F.concat(
            F.format_string("Channel %d held up to %d deliveries unacked; the oldest stayed unacked %.1f s",
                            F.col("channel"), peak, oldest_s),
            F.coalesce(stall_phrase, F.lit("")),
            F.lit(": the consumer is stuck or slower than its queue")),
        evidence=evidence(seqs=pick("items").getField("seq"), tags=pick("items").getField("delivery_tag"),
                          oldest_tag=F.col("oldest.delivery_tag"), oldest_seq=F.col("oldest.seq"),
                          oldest_age_seconds=oldest_s, stall_seconds=stall_s, prefetch_limit=F.col("stall_limit"),
                          peak_unacked=peak),
    )


def unbounded_prefetch(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Manual-ack consumers started with no prefetch limit in force: the broker pushes them the
    whole queue, all of it unacked in client memory. The timeline counts them
    (`unbounded_manual_consumes`); the evidence lists the channel's manual-ack basic.consume frames."""
    unbounded = tables["channels"].filter(F.col("unbounded_manual_consumes") > 0)
    consumes = tables["frames"].filter((F.col("method") == "basic.consume") & (F.col("no_ack") == False)  # noqa: E712
                                       & (F.col("direction") == "to_broker"))
    consumes = ranked(incarnation_of(consumes, tables["channels"]), INCARNATION, ["seq"]).groupBy(*INCARNATION).agg(
        firsts("seq", "queue").alias("items"))
    found = unbounded.join(consumes, on=INCARNATION, how="left")
    return raw_finding(
        found, "unbounded_prefetch",
        first_ts_ns=F.col("open_ts_ns"),
        last_ts_ns=F.coalesce("end_ts_ns", "observed_until_ts_ns", "open_ts_ns"),
        count=F.col("unbounded_manual_consumes"),
        summary=F.format_string("%d manual-ack consumers on channel %d have no prefetch limit (no basic.qos, or 0): "
                                "the broker pushes them the whole queue, unacked, into client memory",
                                "unbounded_manual_consumes", "channel"),
        evidence=evidence(seqs=F.col("items.seq"), queues=F.col("items.queue"),
                          peak_unacked=F.col("peak_unacked")),
    )


def unknown_delivery_tag(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """basic.ack/nack/reject naming a tag not outstanding on its channel (a double ack, a tag
    never delivered, a tag of another channel): RabbitMQ closes the channel with 406, and every
    delivery unacked on it comes again. The timeline's `violations` rows say which and how known."""
    rows = ranked(tables["violations"], INCARNATION, ["seq", "kind"])
    found = rows.groupBy(*INCARNATION).agg(
        F.min("agent_id").alias("agent_id"),
        F.count(F.lit(1)).alias("n"),
        F.min("ts_ns").alias("first_ns"), F.max("ts_ns").alias("last_ns"),
        firsts("seq", "kind", "delivery_tag", "method", "evidence", "delivered_channel", "broker_close_seq",
               "broker_reply_code", "broker_reply_text").alias("items"),
    )
    # The offending frames and the broker's closes that answered them, for Wireshark.
    frames_seen = F.array_sort(F.array_distinct(F.array_compact(
        F.concat(F.col("items.seq"), F.col("items.broker_close_seq")))))
    kinds = F.array_distinct(F.col("items.kind"))
    return raw_finding(
        found, "unknown_delivery_tag",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        summary=F.format_string("%d basic.ack/nack/reject on channel %d named a delivery tag not outstanding there "
                                "(%s): the broker closes the channel with 406 PRECONDITION_FAILED",
                                F.col("n"), F.col("channel"), F.array_join(kinds, ", ")),
        evidence=evidence(seqs=frames_seen, tags=F.col("items.delivery_tag"), violations=F.col("items.kind"),
                          methods=F.col("items.method"), evidence_from=F.col("items.evidence"),
                          delivered_on_channels=F.col("items.delivered_channel"),
                          reply_code=F.col("items")[0]["broker_reply_code"],
                          reply_text=F.col("items")[0]["broker_reply_text"]),
    )
