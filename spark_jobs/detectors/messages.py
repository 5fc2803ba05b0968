"""Kinds that follow one message across deliveries, channels and connections: requeue_loop (one
finding per message) and redelivery_after_close (one per closed channel incarnation).

A message is known by `message_identity` (its message_id, else a hash of body, exchange and
routing key). Identical bodies share an identity, so a later delivery counts as the same message
coming back only when the broker says so: `redelivered=true` after a requeue, or a higher
x-death count after a dead-lettering. So a loop is made of the deliveries `in_loop` only: bounced
ones and those that came back. A plain delivery of an identical body (first delivered, not
bounced) is another message, wherever it falls between a bounce and its return.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.thresholds import Thresholds

from .common import INCARNATION, MAX_EVIDENCE, connection_facts, evidence, firsts, ranked, raw_finding

Tables = dict[str, DataFrame]

BOUNCED_BY = ("nack", "reject")
CLOSED = ("channel_closed", "connection_closed")


def came_back_record(d) -> bool:
    """A Delivery record (analyzer/timeline/records.py) of a known message the broker says it had
    delivered before (redelivered, or dead-lettered before): every finding of these kinds has one,
    so a lake without any has none. The pass counts them (connection_pass.py)."""
    return d.message_identity is not None and (d.redelivered is True or (d.x_death_count or 0) > 0)


def came_back() -> Column:
    """`came_back_record` as a Spark column."""
    return (F.col("message_identity").isNotNull()
            & ((F.col("redelivered") == True) | (F.coalesce(F.col("x_death_count"), F.lit(0)) > 0)))  # noqa: E712


def can_loop() -> Column:
    """Deliveries of a known message that make it a candidate for requeue_loop: bounced by the
    consumer, or dead-lettered before. A message none of whose deliveries is one is in no loop."""
    return (F.col("message_identity").isNotNull()
            & (F.col("outcome").isin(*BOUNCED_BY) | (F.coalesce(F.col("x_death_count"), F.lit(0)) > 0)))


def in_loop() -> Column:
    """Deliveries that can be part of a loop: bounced by the consumer, or come back. requeue_loop
    reads no other."""
    return can_loop() | came_back()


def left_at_close() -> Column:
    """Deliveries left unacked when their channel or connection closed: redelivery_after_close's
    starting points."""
    return F.col("outcome").isin(*CLOSED) & F.col("settle_ts_ns").isNotNull()


def candidate() -> Column:
    """Every delivery either kind reads: in a loop, or left at a close."""
    return in_loop() | (F.col("message_identity").isNotNull() & left_at_close())


def _place(connection_id: str = "connection_id", channel: str = "channel"):
    return F.concat_ws("#", F.col(connection_id), F.col(channel).cast("string"))


def requeue_loop(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """A message that keeps coming back because its consumer nacks or rejects it: requeued (it
    returns redelivered) or dead-lettered back to its queue (its x-death count grows). Fires at
    `requeue_loop_deliveries` deliveries in the loop, or an x-death count of `dead_letter_loop_count`
    (a dead-letter cycle whose earlier turns predate the capture). Pinned to the channel that
    bounced it most. Only the deliveries in the loop count (`in_loop`)."""
    deliveries = tables["deliveries"].filter(in_loop())
    # Only a message delivered more than once, or dead-lettered before, can be in a loop: most are
    # delivered once, and the windows below need not sort them.
    repeated = (deliveries.groupBy("message_identity")
                .agg(F.count(F.lit(1)).alias("_n"), F.max("x_death_count").alias("_x_death"))
                .filter((F.col("_n") > 1) | (F.col("_x_death") > 0)).select("message_identity"))
    deliveries = deliveries.join(repeated, on="message_identity", how="left_semi")
    # Across connections the capture clock orders deliveries; seq breaks ties within one. A bounce is
    # followed in the loop by its return: plain deliveries of identical bodies are not in it.
    journey = Window.partitionBy("message_identity").orderBy("ts_ns", "connection_id", "seq")
    came_back = (((F.col("requeue") == True) & (F.lead("redelivered").over(journey) == True))  # noqa: E712
                 | (F.coalesce(F.lead("x_death_count").over(journey), F.lit(0))
                    > F.coalesce(F.col("x_death_count"), F.lit(0))))
    bounced = F.col("outcome").isin(*BOUNCED_BY) & F.lead("seq").over(journey).isNotNull() & came_back
    deliveries = deliveries.withColumn("_bounced", F.coalesce(bounced, F.lit(False)).cast("bigint"))

    # Per place (channel incarnation) the message went through, then per message across places:
    # every step keeps the partitioning by message_identity, so Spark shuffles the deliveries once.
    deliveries = deliveries.withColumn("_rank", F.row_number().over(
        Window.partitionBy("message_identity", *INCARNATION).orderBy("seq")))
    places = deliveries.groupBy("message_identity", *INCARNATION).agg(
        F.min("agent_id").alias("agent_id"),
        F.count(F.lit(1)).alias("_here_n"), F.sum("_bounced").alias("_here_bounced"),
        F.max("x_death_count").alias("_here_x_death"),
        F.min("ts_ns").alias("_here_first_ns"), F.max(F.coalesce("settle_ts_ns", "ts_ns")).alias("_here_last_ns"),
        F.min("message_id").alias("_here_message_id"),
        firsts("seq", "delivery_tag").alias("items"))
    message = Window.partitionBy("message_identity")
    # Pinned to the place that bounced it most (then the highest x-death, then the first).
    most = message.orderBy(F.col("_here_bounced").desc(), F.col("_here_x_death").desc_nulls_last(),
                           "_here_first_ns", "connection_id", "channel", "incarnation")
    per_message = (places
                   .withColumn("n", F.sum("_here_n").over(message))
                   .withColumn("bounces", F.sum("_here_bounced").over(message))
                   .withColumn("x_death_max", F.max("_here_x_death").over(message))
                   .withColumn("first_ns", F.min("_here_first_ns").over(message))
                   .withColumn("last_ns", F.max("_here_last_ns").over(message))
                   .withColumn("message_id", F.min("_here_message_id").over(message))
                   .withColumn("places", F.sort_array(F.collect_set(_place()).over(message)))
                   .withColumn("_pick", F.row_number().over(most))
                   .filter(F.col("_pick") == 1)
                   .withColumn("loop_deliveries",
                               F.when(F.col("bounces") > 0, F.col("bounces") + 1).otherwise(F.col("n"))))
    # Frame seqs only mean something within their connection: `items` are the pinned place's.
    by_deliveries = (F.col("bounces") > 0) & (F.col("loop_deliveries") >= thresholds.requeue_loop_deliveries)
    found = per_message.filter(by_deliveries | (F.col("x_death_max") >= thresholds.dead_letter_loop_count))
    return raw_finding(
        found, "requeue_loop",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("loop_deliveries"),
        # The measure that fired: deliveries in the loop, else the x-death count of a dead-letter cycle.
        value=F.when(by_deliveries, F.col("loop_deliveries")).otherwise(F.col("x_death_max")),
        threshold=F.when(by_deliveries, F.lit(thresholds.requeue_loop_deliveries))
        .otherwise(F.lit(thresholds.dead_letter_loop_count)),
        message_identity=F.col("message_identity"),
        summary=F.concat(
            F.format_string("Message %s was delivered %d times and bounced back by basic.nack/basic.reject %d times",
                            F.coalesce("message_id", "message_identity"), F.col("loop_deliveries"), F.col("bounces")),
            F.coalesce(F.when(F.col("x_death_max") > 0, F.format_string(" (dead-lettered %d times)", "x_death_max")),
                       F.lit("")),
            F.format_string(", most often on channel %d: a poison message in a loop; dead-letter it for good or "
                            "limit its deliveries", F.col("channel"))),
        evidence=evidence(seqs=F.col("items.seq"), tags=F.col("items.delivery_tag"), message_id=F.col("message_id"),
                          deliveries=F.col("n"), bounces=F.col("bounces"), x_death_max=F.col("x_death_max"),
                          channels=F.slice(F.col("places"), 1, MAX_EVIDENCE)),
    )


def redelivery_after_close(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Deliveries left unacked when their channel or connection closed, delivered again
    (redelivered=true) afterwards, possibly to another consumer: whatever the first consumer did
    with them may happen twice. One finding per closed incarnation."""
    deliveries = tables["deliveries"].filter(F.col("message_identity").isNotNull())
    closed = deliveries.filter(left_at_close())
    names = connection_facts(tables["connections"]).select("connection_id", "connection_name")
    # Where each message came back, reduced to one row per place: the join stays small even for
    # identities many deliveries share.
    again = (deliveries.filter(F.col("redelivered") == True)  # noqa: E712
             .groupBy("message_identity", "connection_id", "channel", "incarnation")
             .agg(F.max("ts_ns").alias("_again_last_ns"))
             .join(names, on="connection_id", how="left")
             .select("message_identity", "_again_last_ns",
                     F.coalesce("connection_name", "connection_id").alias("_again_on"),
                     _place().alias("_again_place"),
                     F.col("connection_id").alias("_again_connection"), F.col("incarnation").alias("_again_incarnation"),
                     F.col("channel").alias("_again_channel")))
    matched = (closed.join(again, on="message_identity", how="inner")
               .filter((F.col("_again_last_ns") >= F.col("settle_ts_ns"))
                       & ~((F.col("_again_connection") == F.col("connection_id"))
                           & (F.col("_again_channel") == F.col("channel"))
                           & (F.col("_again_incarnation") == F.col("incarnation")))))
    per_delivery = matched.groupBy(*INCARNATION, "seq").agg(
        F.min("agent_id").alias("agent_id"), F.min("ts_ns").alias("ts_ns"), F.min("settle_ts_ns").alias("close_ns"),
        F.min("settle_seq").alias("close_seq"), F.min("outcome").alias("outcome"),
        F.min("delivery_tag").alias("delivery_tag"), F.min("message_identity").alias("message_identity"),
        F.collect_set("_again_on").alias("_on"), F.collect_set("_again_place").alias("_places"))
    found = ranked(per_delivery, INCARNATION, ["seq"]).groupBy(*INCARNATION).agg(
        F.min("agent_id").alias("agent_id"),
        F.count(F.lit(1)).alias("n"),
        F.min("ts_ns").alias("first_ns"), F.max("close_ns").alias("last_ns"),
        F.min("outcome").alias("outcome"), F.max("close_seq").alias("close_seq"),
        firsts("seq", "delivery_tag", "message_identity").alias("items"),
        F.sort_array(F.array_distinct(F.flatten(F.collect_list("_on")))).alias("redelivered_on"),
        F.sort_array(F.array_distinct(F.flatten(F.collect_list("_places")))).alias("redelivered_on_channels"),
    )
    return raw_finding(
        found, "redelivery_after_close",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        summary=F.format_string(
            "%d deliveries left unacked on channel %d when its %s closed were delivered again (redelivered) on %s: "
            "work done on them before the close may be done twice",
            F.col("n"), F.col("channel"), F.regexp_replace("outcome", "_closed$", ""),
            F.array_join(F.slice("redelivered_on", 1, 5), ", ")),
        evidence=evidence(seqs=F.col("items.seq"), tags=F.col("items.delivery_tag"),
                          message_identities=F.col("items.message_identity"),
                          ended_by=F.col("outcome"), end_seq=F.col("close_seq"),
                          redelivered_on=F.slice("redelivered_on", 1, MAX_EVIDENCE),
                          redelivered_on_channels=F.slice("redelivered_on_channels", 1, MAX_EVIDENCE)),
    )
