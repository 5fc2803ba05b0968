"""Channel incarnations as columns: which life of its channel number each frame row belongs to,
and how each life ended. The rules are analyzer/timeline's, for regular connections (regular.py).

A `channel.open` starts an incarnation. It ends at the first `channel.close` of either side, or
the connection's first `connection.close` / `close-ok` if that came first: from that row on the
closer discards what it receives (`cutoff_seq`). A TCP FIN or RST with no AMQP close ends it at
the end of the data, at the FIN/RST row (no cutoff: frames after the FIN still count). Otherwise
it is still open at the end of the data.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from analyzer.timeline.connection import CHANNEL_TRANSITIONS, CONNECTION_ENDS, TRANSPORT_ENDS

from .blocks import running_in_blocks, seq_block

TO_BROKER, TO_CLIENT = "to_broker", "to_client"
INCARNATION = ["connection_id", "channel", "incarnation"]
NEVER = 2**63 - 1  # a cutoff past every seq
# The broker numbers an incarnation's deliveries 1, 2, 3, ...; a tag further than this past the one
# before it (or the first tag past it) means deliveries the data lacks: the reference model's case.
# It also bounds the numbers settling.py spells out per delivery.
MAX_TAG_STEP = 1_000
LIFECYCLE = ("channel.open", "channel.open-ok", "channel.close", "channel.close-ok")
DELIVERING = ("basic.deliver", "basic.get-ok")
# What may come just before each lifecycle row of a channel number, in a regular connection.
LIFECYCLE_AFTER = {
    "channel.open": (None, "channel.close-ok"),
    "channel.open-ok": ("channel.open",),
    "channel.close": ("channel.open-ok",),
    "channel.close-ok": ("channel.close",),
}


def running(*partition: str, order: tuple = ("seq",)) -> Window:
    return (Window.partitionBy(*partition).orderBy(*order)
            .rowsBetween(Window.unboundedPreceding, Window.currentRow))


def is_transition(direction, method):
    """A row the per-channel state machine acts on (connection.CHANNEL_TRANSITIONS)."""
    pairs = [F.struct(F.lit(d).alias("d"), F.lit(m).alias("m")) for d, m in CHANNEL_TRANSITIONS]
    return F.struct(direction.alias("d"), method.alias("m")).isin(*pairs)


def connection_facts(frames: DataFrame) -> DataFrame:
    """Per connection: agent, last row, the first AMQP connection close and the first FIN/RST."""
    ch0 = F.coalesce("channel", F.lit(0)) == 0
    closing = ch0 & F.col("method").isin(*CONNECTION_ENDS)
    transport = ch0 & F.col("method").isin(*TRANSPORT_ENDS)
    row = F.struct("seq", "ts_ns", "method")
    return (frames.groupBy("connection_id").agg(
        F.min_by("agent_id", "seq").alias("agent_id"),
        F.max_by("ts_ns", "seq").alias("last_ts_ns"),
        F.min_by(F.when(closing, row), F.when(closing, F.col("seq"))).alias("conn_end"),
        F.min_by(F.when(transport, row), F.when(transport, F.col("seq"))).alias("transport_end"),
    ))


def channel_rows(frames: DataFrame) -> DataFrame:
    """The rows of channels other than 0 that matter to the timelines, each with its incarnation
    number and the lifecycle row before it; plus `bad_order`: a row out of the regular grammar.

    Also the running values later steps need, as of each row (structs of `at`, the seq, and `value`
    of the latest such row in this incarnation, or null): the previous and the latest delivery,
    the latest basic.qos of each kind (consumer_qos, channel_qos), and the get, get-ok or
    get-empty before the row (previous_get_row).

    One pass over each channel number in seq order, in blocks (blocks.py): the hot channel is
    millions of rows. Values of the current incarnation come from the same pass: a row belongs to
    the incarnation of the last channel.open at or before it (`open_at`)."""
    method, direction = F.col("method"), F.col("direction")
    lifecycle = ((method.isin("channel.open") & (direction == TO_BROKER))
                 | (method.isin("channel.open-ok") & (direction == TO_CLIENT))
                 | method.isin("channel.close", "channel.close-ok"))
    relevant = (F.coalesce("channel", F.lit(0)) != 0) & (lifecycle | is_transition(direction, method)) \
        & ~(method.isin(*DELIVERING) & F.col("delivery_tag").isNull())  # cut short before its tag: skipped
    is_delivery = method.isin(*DELIVERING) & (direction == TO_CLIENT)
    opens = method == "channel.open"
    qos = (method == "basic.qos") & (direction == TO_BROKER) & F.col("prefetch_count").isNotNull()
    per_channel = F.coalesce(F.col("prefetch_global"), F.lit(False))
    get = (method == "basic.get") & (direction == TO_BROKER)
    get_answer = method.isin("basic.get-ok", "basic.get-empty") & (direction == TO_CLIENT)

    def at(condition, value):
        return F.when(condition, F.struct(F.col("seq").alias("at"), value.alias("value")))

    rows = running_in_blocks(
        frames.where(relevant).select("*", lifecycle.alias("is_lifecycle"), is_delivery.alias("is_delivery")),
        ["connection_id", "channel"], ["seq"], seq_block(),
        lasts={"open_at": (F.when(opens, F.col("seq")), True),
               "previous_lifecycle": (F.when(lifecycle, method), False),
               "previous_delivery": (at(is_delivery, F.col("delivery_tag")), False),
               "last_delivery": (at(is_delivery, F.col("delivery_tag")), True),
               "consumer_qos": (at(qos & ~per_channel, F.col("prefetch_count")), True),
               "channel_qos": (at(qos & per_channel, F.col("prefetch_count")), True),
               "previous_get_row": (at(get | get_answer, F.struct(get.alias("is_get"), F.col("queue"),
                                                                   F.coalesce("no_ack", F.lit(False)).alias("no_ack"))),
                                    False)},
        sums={"incarnation": F.when(opens, 1).otherwise(0)})
    rows = rows.withColumn("incarnation", F.col("incarnation").cast("int"))
    in_this_life = {name: F.when(F.col("open_at").isNull() | (F.col(f"{name}.at") > F.col("open_at")), F.col(name))
                    for name in ("previous_delivery", "last_delivery", "consumer_qos", "channel_qos",
                                 "previous_get_row")}
    rows = rows.withColumns(in_this_life)
    grammar = F.lit(False)
    for name, allowed in LIFECYCLE_AFTER.items():
        ok = F.lit(False)
        for previous in allowed:
            ok = ok | (F.col("previous_lifecycle").isNull() if previous is None
                       else F.col("previous_lifecycle") == previous)
        grammar = grammar | ((method == name) & ~ok)
    # A frame outside any incarnation (before the first open, after a close-ok) would start one
    # whose history is unknown: the reference model's case, not this one.
    orphan = ~F.col("is_lifecycle") & ((F.col("incarnation") == 0)
                                       | (F.col("previous_lifecycle") == "channel.close-ok"))
    # Tags rise within an incarnation; a tag that does not is a life whose open the data lacks.
    previous_tag = F.col("previous_delivery.value")
    tag_restart = F.col("is_delivery") & ((F.col("delivery_tag") < 1)
                                          | (previous_tag.isNotNull() & (F.col("delivery_tag") <= previous_tag))
                                          | (F.col("delivery_tag") - F.coalesce(previous_tag, F.lit(0)) > MAX_TAG_STEP))
    return rows.withColumn("bad_order", (F.col("is_lifecycle") & grammar) | orphan | tag_restart)


def incarnation_ends(rows: DataFrame, connections: DataFrame) -> DataFrame:
    """One row per incarnation: its open, how and where it ended, and its cutoff."""
    close = F.col("method") == "channel.close"
    close_row = F.struct("seq", "ts_ns", "direction", "reply_code", "reply_text", "failing_method")
    lives = (rows.where(F.col("incarnation") > 0).groupBy(*INCARNATION).agg(
        F.min_by(F.when(F.col("method") == "channel.open", F.struct("seq", "ts_ns")),
                 F.when(F.col("method") == "channel.open", F.col("seq"))).alias("open"),
        F.min_by(F.when(close, close_row), F.when(close, F.col("seq"))).alias("close")))
    lives = lives.join(connections, on="connection_id", how="inner")
    by_channel_close = F.col("close").isNotNull() & (
        F.col("conn_end").isNull() | (F.col("close.seq") < F.col("conn_end.seq")))
    by_connection = ~by_channel_close & F.col("conn_end").isNotNull()
    by_transport = ~by_channel_close & ~by_connection & F.col("transport_end").isNotNull()
    return lives.select(
        *INCARNATION, "agent_id",
        F.col("open.seq").alias("open_seq"), F.col("open.ts_ns").alias("open_ts_ns"),
        F.when(by_channel_close, F.lit("channel.close")).when(by_connection, F.lit("connection.close"))
        .when(by_transport, F.col("transport_end.method")).otherwise(F.lit("end_of_data")).alias("ended_by"),
        F.when(by_channel_close, F.col("close.seq")).when(by_connection, F.col("conn_end.seq"))
        .when(by_transport, F.col("transport_end.seq")).alias("end_seq"),
        F.when(by_channel_close, F.col("close.ts_ns")).when(by_connection, F.col("conn_end.ts_ns"))
        .when(by_transport, F.col("transport_end.ts_ns")).alias("end_ts_ns"),
        # Rows after this one are discarded by the closer: an AMQP close only.
        F.when(by_channel_close, F.col("close.seq")).when(by_connection, F.col("conn_end.seq"))
        .otherwise(F.lit(NEVER)).alias("cutoff_seq"),
        F.when(by_channel_close, F.lit("channel_closed")).when(by_connection | by_transport,
                                                              F.lit("connection_closed")).alias("end_outcome"),
        F.when(by_channel_close, F.when(F.col("close.direction") == TO_BROKER, F.lit("client"))
               .otherwise(F.lit("broker"))).alias("closed_by"),
        F.when(by_channel_close, F.col("close.reply_code")).alias("close_code"),
        F.when(by_channel_close, F.col("close.reply_text")).alias("close_text"),
        F.when(by_channel_close, F.col("close.failing_method")).alias("failing_method"),
        F.when(~by_channel_close & ~by_connection & ~by_transport, F.col("last_ts_ns")).alias("observed_until_ts_ns"),
        # An open after the connection's end or its FIN would be born closed: the reference model's case.
        ((F.col("conn_end").isNotNull() & (F.col("open.seq") > F.col("conn_end.seq")))
         | (F.col("transport_end").isNotNull() & (F.col("open.seq") > F.col("transport_end.seq")))
         | (F.col("conn_end.method") == "connection.close-ok")).alias("bad_end"),
    )
