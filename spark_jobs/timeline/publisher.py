"""The publisher side as columns: confirm numbering, what confirmed each publish, out-of-order
distance, returns, and the checks that the broker confirmed only what was published.

After the first confirm.select both sides number the client's publishes from 1; the confirm of
number n is found as a delivery's ack is (settling.py). The oldest publish still unconfirmed when a
confirm comes is the first number whose running-maximum confirm row lies after it: a running
count, not a self-join.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .blocks import running_in_blocks, seq_block
from .incarnations import INCARNATION, NEVER, TO_BROKER, TO_CLIENT
from .settling import first_settling_frame

CONFIRM_METHODS = {"basic.ack": "acked", "basic.nack": "nacked"}
PUBLISH_COLUMNS = ("seq", "ts_ns", "exchange", "routing_key", "mandatory", "message_id", "message_identity",
                   "delivery_mode", "body_size")


def confirm_selects(rows: DataFrame) -> DataFrame:
    """Per incarnation: the first confirm.select it acted on, and whether a select-ok came without
    its select before it (the reference model's case: the numbering cannot be aligned)."""
    select = (F.col("method") == "confirm.select") & (F.col("direction") == TO_BROKER) \
        & (F.col("seq") < F.col("cutoff_seq"))
    select_ok = (F.col("method") == "confirm.select-ok") & (F.col("direction") == TO_CLIENT) \
        & (F.col("seq") < F.col("cutoff_seq"))
    return (rows.where(select | select_ok).groupBy(*INCARNATION).agg(
        F.min(F.when(select, F.col("seq"))).alias("select_seq"),
        F.min(F.when(select_ok, F.col("seq"))).alias("select_ok_seq"))
        .select(*INCARNATION, "select_seq", (F.col("select_ok_seq") < F.coalesce(F.col("select_seq"), F.lit(NEVER)))
                .alias("unaligned")))


def publishes(rows: DataFrame, selects: DataFrame) -> DataFrame:
    """Every publish with its mode and, for those the channel numbered, its confirm number."""
    published = (rows.where((F.col("method") == "basic.publish") & (F.col("direction") == TO_BROKER))
                 .join(selects.select(*INCARNATION, "select_seq"), on=INCARNATION, how="left"))
    confirm = F.col("select_seq").isNotNull() & (F.col("select_seq") < F.col("seq"))
    numbered = confirm & (F.col("seq") < F.col("cutoff_seq"))
    published = (published.withColumn("mode", F.when(confirm, F.lit("confirm")).otherwise(F.lit("none")))
                 .withColumn("numbered", numbered))
    counted = running_in_blocks(published, INCARNATION, ["seq"], seq_block(),
                                sums={"_numbered_so_far": F.col("numbered").cast("long")})
    return counted.withColumn("confirm_seq", F.when(F.col("numbered"), F.col("_numbered_so_far"))).drop(
        "_numbered_so_far")


def confirms(rows: DataFrame, selects: DataFrame, published: DataFrame) -> DataFrame:
    """The broker's basic.ack/nack the channel acted on, each with how many publishes were numbered
    before it and, if multiple, its reach."""
    acted = (rows.where(F.col("method").isin(*CONFIRM_METHODS) & (F.col("direction") == TO_CLIENT)
                        & F.col("delivery_tag").isNotNull() & (F.col("seq") < F.col("cutoff_seq")))
             .join(selects.select(*INCARNATION, "select_seq"), on=INCARNATION, how="inner")
             .where(F.col("seq") > F.col("select_seq"))
             .select(*INCARNATION, "seq", "ts_ns", "method", "delivery_tag",
                     F.coalesce(F.col("multiple"), F.lit(False)).alias("multiple"), F.lit(False).alias("is_publish")))
    numbered = published.where(F.col("numbered")).select(
        *INCARNATION, "seq", F.lit(None).cast("long").alias("ts_ns"), F.lit(None).cast("string").alias("method"),
        F.lit(None).cast("long").alias("delivery_tag"), F.lit(None).cast("boolean").alias("multiple"),
        F.lit(True).alias("is_publish"))
    counted = (running_in_blocks(acted.unionByName(numbered), INCARNATION, ["seq"], seq_block(),
                                 sums={"published_before": F.col("is_publish").cast("long")})
               .where(~F.col("is_publish")).drop("is_publish"))
    reach = F.when(F.col("delivery_tag") == 0, F.col("published_before")) \
        .otherwise(F.least("delivery_tag", "published_before"))
    return counted.withColumn("reach", F.when(F.col("multiple"), reach))


def bad_confirms(confirm: DataFrame) -> DataFrame:
    """Connections with a confirm naming a number not published yet: the capture showed it early
    (the reference model holds it for its publish)."""
    early = (F.col("delivery_tag") > F.col("published_before")) & ~(F.col("multiple") & (F.col("delivery_tag") == 0))
    return confirm.where(early).select("connection_id")


def first_confirm(published: DataFrame, confirm: DataFrame) -> DataFrame:
    """(incarnation, confirm_seq) -> `confirmer`: the broker's basic.ack/nack that settled the publish."""
    items = published.where(F.col("numbered")).select(*INCARNATION, "confirm_seq", F.col("seq").alias("item_seq"))
    return (first_settling_frame(items, confirm, "confirm_seq", ("seq", "ts_ns", "method", "delivery_tag", "multiple"))
            .withColumnRenamed("frame", "confirmer"))


def waiting_and_overtaking(numbered: DataFrame) -> DataFrame:
    """Per numbered publish (with its `confirmer`): pending_before (earlier publishes unconfirmed
    when it was sent) and out_of_order_by (for a single confirm: its number minus the oldest number
    still unconfirmed then; 0 in order)."""
    settled_at = F.col("confirmer.seq")
    # pending_before: numbered before it, minus those confirmed before it was sent.
    events = (numbered.select(*INCARNATION, "seq", "confirm_seq", F.lit(0).alias("confirmed"),
                              F.lit(True).alias("is_publish"))
              .unionByName(numbered.where(settled_at.isNotNull()).select(
                  *INCARNATION, settled_at.alias("seq"), F.lit(None).cast("long").alias("confirm_seq"),
                  F.lit(1).alias("confirmed"), F.lit(False).alias("is_publish"))))
    pending = (running_in_blocks(events, INCARNATION, ["seq"], seq_block(),
                                 sums={"confirmed_so_far": F.col("confirmed")})
               .where(F.col("is_publish"))
               .select(*INCARNATION, "confirm_seq",
                       (F.col("confirm_seq") - 1 - F.col("confirmed_so_far")).alias("pending_before")))
    # The oldest number unconfirmed at row x is 1 + how many numbers have their running-maximum
    # confirm row at or before x (that maximum never falls with the number).
    marks = (running_in_blocks(numbered.select(*INCARNATION, "confirm_seq", F.coalesce(settled_at, F.lit(NEVER))
                                               .alias("settled_at")),
                               INCARNATION, ["confirm_seq"], seq_block("confirm_seq"),
                               maxes={"at": (F.col("settled_at"), True)})
             .select(*INCARNATION, "at", F.lit(None).cast("long").alias("confirm_seq"), F.lit(0).alias("is_query")))
    queries = numbered.where(settled_at.isNotNull() & ~F.col("confirmer.multiple")).select(
        *INCARNATION, settled_at.alias("at"), "confirm_seq", F.lit(1).alias("is_query"))
    oldest = (running_in_blocks(marks.unionByName(queries), INCARNATION, ["at", "is_query"], seq_block("at"),
                                sums={"through": 1 - F.col("is_query")})
              .where(F.col("is_query") == 1)
              .select(*INCARNATION, "confirm_seq",
                      F.greatest(F.lit(0), F.col("confirm_seq") - (F.col("through") + 1)).alias("out_of_order_by")))
    return (numbered.join(pending, on=[*INCARNATION, "confirm_seq"], how="left")
            .join(oldest, on=[*INCARNATION, "confirm_seq"], how="left")
            .withColumn("out_of_order_by", F.when(settled_at.isNotNull(),
                                                  F.coalesce(F.col("out_of_order_by"), F.lit(0)))))


def returns(rows: DataFrame, published: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(returned publishes, bad connections). The k-th basic.return of a message identity names
    the k-th mandatory publish of it; that holds where that publish came before the return and
    was not confirmed before it, else the connection goes to the reference model."""
    returned = (rows.where((F.col("method") == "basic.return") & (F.col("direction") == TO_CLIENT)
                           & (F.col("seq") < F.col("cutoff_seq")))
                .select(*INCARNATION, "message_identity", F.col("seq").alias("return_seq"),
                        F.col("reply_code").alias("return_code"), F.col("reply_text").alias("return_text")))
    mandatory = published.where(F.coalesce(F.col("mandatory"), F.lit(False)) & (F.col("seq") < F.col("cutoff_seq")))
    key = [*INCARNATION, "message_identity"]
    ranked_returns = returned.withColumn("rank", F.row_number().over(Window.partitionBy(*key).orderBy("return_seq")))
    ranked_publishes = mandatory.select(*key, "seq", F.col("confirmer.seq").alias("confirmed_seq")).withColumn(
        "rank", F.row_number().over(Window.partitionBy(*key).orderBy("seq")))
    matched = ranked_returns.join(ranked_publishes, on=[*key, "rank"], how="inner")
    bad = matched.where((F.col("seq") > F.col("return_seq")) | (F.col("confirmed_seq") < F.col("return_seq"))) \
        .select("connection_id")
    missing_identity = (returned.where(F.col("message_identity").isNull()).select("connection_id")
                        .unionByName(mandatory.where(F.col("message_identity").isNull()).select("connection_id")))
    return (matched.select(*INCARNATION, "seq", "return_code", "return_text", "return_seq"),
            bad.unionByName(missing_identity))


def settled_publishes(published: DataFrame, overdue_ns: int) -> DataFrame:
    """The publishes table's outcome columns from the confirm and the incarnation's end."""
    confirmed = F.col("confirmer").isNotNull()
    numbered = F.col("numbered")
    confirm_mode = F.col("mode") == "confirm"
    still_open = F.col("ended_by") == "end_of_data"
    outcome = F.lit(None).cast("string")
    for method, name in CONFIRM_METHODS.items():
        outcome = F.when(F.col("confirmer.method") == method, F.lit(name)).otherwise(outcome)
    overdue = F.col("observed_until_ts_ns") - F.col("ts_ns") > F.lit(overdue_ns)
    after_end = ~numbered & confirm_mode  # sent after its channel's close: lost at once
    waiting = numbered & ~confirmed
    end_is_later = F.col("end_seq") >= F.col("seq")
    settle_seq = (F.when(confirmed, F.col("confirmer.seq")).when(after_end, F.col("seq"))
                  .when(waiting & ~still_open, F.greatest("end_seq", "seq"))
                  .when(~confirm_mode & (F.col("seq") > F.col("cutoff_seq")), F.col("seq")))
    settle_ts = (F.when(confirmed, F.col("confirmer.ts_ns")).when(after_end, F.col("ts_ns"))
                 .when(waiting & ~still_open, F.when(end_is_later, F.col("end_ts_ns")).otherwise(F.col("ts_ns"))))
    return published.select(
        "*",
        F.when(confirmed, outcome).when(after_end, F.lit("lost"))
        .when(waiting & still_open, F.when(overdue, F.lit("overdue")).otherwise(F.lit("open")))
        .when(waiting, F.lit("lost")).otherwise(F.lit("untracked")).alias("outcome"),
        F.when(confirmed, F.col("confirmer.delivery_tag")).alias("confirm_tag"),
        F.when(confirmed, F.col("confirmer.multiple")).alias("confirm_multiple"),
        F.when(confirmed, F.col("out_of_order_by") > 0).alias("out_of_order"),
        settle_seq.cast("long").alias("settle_seq"),
        settle_ts.cast("long").alias("settle_ts_ns"),
        (settle_ts - F.col("ts_ns")).cast("long").alias("settle_latency_ns"),
        F.when(waiting & still_open, F.col("observed_until_ts_ns")).alias("publish_observed_until"),
    )
