"""Publisher-side kinds, one finding per channel incarnation: lost_confirm, confirm_nack,
out_of_order_confirm, unroutable_returned, unconfirmed_persistent_publish, synchronous_confirms.

They read `publishes` (schema.PUBLISHES): the timeline has already decided each publish's mode and
outcome, and marks `unknown` whatever a mid-stream start or a capture gap hides, so a filter on
an explicit outcome or mode never turns the unknown into a finding.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.thresholds import Thresholds
from spark_jobs.timeline.blocks import running_in_blocks, seq_block

from .common import (INCARNATION, MAX_EVIDENCE, channel_ends, evidence, firsts, incarnation_of, ranked, raw_finding,
                     seconds)

Tables = dict[str, DataFrame]


def _per_incarnation(publishes: DataFrame, *item_columns: str, **extra) -> DataFrame:
    """Count, span and the first publishes' `item_columns` (seq first) per incarnation."""
    rows = ranked(publishes, INCARNATION, ["seq"])
    return rows.groupBy(*INCARNATION).agg(
        F.min("agent_id").alias("agent_id"),
        F.count(F.lit(1)).alias("n"),
        F.min("ts_ns").alias("first_ns"),
        F.max(F.coalesce("settle_ts_ns", "ts_ns")).alias("last_ns"),
        firsts("seq", *item_columns).alias("items"),
        *[column.alias(name) for name, column in extra.items()],
    )


def lost_confirm(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Confirm-mode publishes whose channel or connection ended before their confirm: the
    publisher must assume them gone. Tx publishes left uncommitted are the application's own
    rollback, not a confirm it was promised, so they are not counted here."""
    lost = tables["publishes"].filter((F.col("outcome") == "lost") & (F.col("mode") == "confirm"))
    found = _per_incarnation(lost, "confirm_seq", "message_identity").join(
        channel_ends(tables["channels"]), on=INCARNATION, how="left")
    return raw_finding(
        found, "lost_confirm",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        summary=F.format_string(
            "%d confirm-mode publishes on channel %d were never confirmed: the channel ended (%s) first, "
            "so the publisher must republish them", "n", "channel", F.coalesce("ended_by", F.lit("closed"))),
        evidence=evidence(seqs=F.col("items.seq"), confirm_seqs=F.col("items.confirm_seq"),
                          message_identities=F.col("items.message_identity"), ended_by=F.col("ended_by"),
                          end_seq=F.col("end_seq"), close_code=F.col("close_code"), close_text=F.col("close_text")),
    )


def confirm_nack(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Publishes the broker settled with basic.nack: it refused responsibility (queue length limit
    with reject-publish, an internal error); the publisher has to republish or give up."""
    nacked = tables["publishes"].filter(F.col("outcome") == "nacked")
    found = _per_incarnation(nacked, "confirm_tag", "confirm_seq", "message_identity")
    return raw_finding(
        found, "confirm_nack",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        summary=F.format_string("%d publishes on channel %d were refused by the broker (basic.nack): it took no "
                                "responsibility for them", "n", "channel"),
        evidence=evidence(seqs=F.col("items.seq"), tags=F.col("items.confirm_tag"),
                          confirm_seqs=F.col("items.confirm_seq"), message_identities=F.col("items.message_identity")),
    )


def out_of_order_confirm(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Single confirms that overtook an earlier publish still unconfirmed. RabbitMQ does this
    legitimately (transient messages confirmed before persistent ones wait for fsync), so it is
    information: it matters only to a client that assumes confirms come in order."""
    overtaking = tables["publishes"].filter((F.col("out_of_order") == True)  # noqa: E712 (null: not known)
                                            & (F.col("confirm_multiple") == False))  # noqa: E712
    found = _per_incarnation(overtaking, "confirm_tag", "confirm_seq", "message_identity",
                             most_overtaken=F.max("out_of_order_by"))
    return raw_finding(
        found, "out_of_order_confirm",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        value=F.col("most_overtaken"),
        summary=F.format_string(
            "%d confirms on channel %d arrived while earlier publishes were still unconfirmed (up to %d numbers "
            "ahead of the oldest): "
            "allowed by the protocol, a problem only for a client that relies on confirm order",
            "n", "channel", "most_overtaken"),
        evidence=evidence(seqs=F.col("items.seq"), tags=F.col("items.confirm_tag"),
                          confirm_seqs=F.col("items.confirm_seq"), message_identities=F.col("items.message_identity"),
                          out_of_order_by_max=F.col("most_overtaken")),
    )


def unroutable_returned(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """basic.return frames: a mandatory publish that no queue took. Counted from the frames, not
    from the publishes they were matched to, so a return whose publish the capture missed counts too."""
    returns = tables["frames"].filter((F.col("method") == "basic.return") & (F.col("direction") == "to_client"))
    returns = incarnation_of(returns, tables["channels"])
    rows = ranked(returns, INCARNATION, ["seq"])
    found = rows.groupBy(*INCARNATION).agg(
        F.min("agent_id").alias("agent_id"),
        F.count(F.lit(1)).alias("n"),
        F.min("ts_ns").alias("first_ns"), F.max("ts_ns").alias("last_ns"),
        firsts("seq", "reply_code", "reply_text", "exchange", "routing_key", "message_identity").alias("items"),
    )
    first_reply = F.concat_ws(" ", F.col("items")[0]["reply_code"].cast("string"), F.col("items")[0]["reply_text"])
    return raw_finding(
        found, "unroutable_returned",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        summary=F.format_string("%d mandatory publishes on channel %d came back unroutable (basic.return %s): "
                                "no queue was bound for their routing key", "n", "channel", first_reply),
        evidence=evidence(seqs=F.col("items.seq"), return_codes=F.col("items.reply_code"),
                          reply_code=F.col("items")[0]["reply_code"], reply_text=F.col("items")[0]["reply_text"],
                          exchanges=F.col("items.exchange"), routing_keys=F.col("items.routing_key"),
                          message_identities=F.col("items.message_identity")),
    )


def unconfirmed_persistent_publish(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """Persistent publishes on a channel in neither confirm nor tx mode: durability was asked for,
    but the publisher never learns whether the broker stored the message. Mode `unknown` (the
    channel's history is not in the data) is not `none`."""
    plain = tables["publishes"].filter((F.col("persistent") == True) & (F.col("mode") == "none"))  # noqa: E712
    found = _per_incarnation(plain, "exchange", "routing_key", "message_identity")
    return raw_finding(
        found, "unconfirmed_persistent_publish",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        summary=F.format_string("%d persistent publishes on channel %d were sent without publisher confirms or a "
                                "transaction: the publisher cannot know the broker stored them", "n", "channel"),
        evidence=evidence(seqs=F.col("items.seq"), exchanges=F.col("items.exchange"),
                          routing_keys=F.col("items.routing_key"), message_identities=F.col("items.message_identity")),
    )


def synchronous_confirms(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """A confirm-mode publisher that sends each publish only once every earlier one is confirmed
    (`pending_before == 0`), nearly always, and at once: one message per round trip and fsync.
    Only publishes whose pending count is known take part (mid-stream numbering is not)."""
    known = tables["publishes"].filter((F.col("mode") == "confirm") & F.col("pending_before").isNotNull())
    lockstep = F.col("pending_before") == 0
    # Running values in blocks of seq (timeline.blocks): a hot publisher's millions of publishes
    # never sit in one task. `_rank` numbers the lockstep publishes in seq order.
    rows = running_in_blocks(known.withColumn("_lockstep", lockstep), INCARNATION, ["seq"], seq_block(),
                             sums={"_rank": lockstep.cast("int")},
                             maxes={"_earlier_settle_ns": (F.col("settle_ts_ns"), False)})
    # How long after the last earlier confirm this publish went out: a publisher held back by its
    # confirms publishes again at once; one that is merely idle between messages does not.
    rows = rows.withColumn("_idle_ns", F.when(F.col("_lockstep"), F.col("ts_ns") - F.col("_earlier_settle_ns")))
    found = rows.groupBy(*INCARNATION).agg(
        F.min("agent_id").alias("agent_id"),
        F.count(F.lit(1)).alias("n"),
        F.sum(F.col("_lockstep").cast("bigint")).alias("lockstep"),
        F.percentile_approx("_idle_ns", 0.5).alias("median_idle_ns"),
        F.min("ts_ns").alias("first_ns"), F.max(F.coalesce("settle_ts_ns", "ts_ns")).alias("last_ns"),
        F.sort_array(F.collect_list(F.when(F.col("_lockstep") & (F.col("_rank") <= MAX_EVIDENCE),
                                           F.struct("seq", "confirm_seq", "message_identity")))).alias("items"),
    ).withColumn("share", F.col("lockstep") / F.col("n"))
    found = found.filter((F.col("n") >= thresholds.synchronous_min_publishes)
                         & (F.col("share") >= thresholds.synchronous_min_share)
                         & (seconds(F.col("median_idle_ns")) <= thresholds.synchronous_max_idle_seconds))
    span = seconds(F.col("last_ns") - F.col("first_ns"))
    return raw_finding(
        found, "synchronous_confirms",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("lockstep"),
        value=F.col("share"), threshold=F.lit(thresholds.synchronous_min_share),
        summary=F.format_string(
            "%d of %d confirm-mode publishes on channel %d (%.0f%%) waited for every earlier confirm: lockstep "
            "publishing caps throughput at one message per round trip; keep a window of publishes in flight",
            "lockstep", "n", "channel", F.col("share") * 100),
        evidence=evidence(seqs=F.col("items.seq"), confirm_seqs=F.col("items.confirm_seq"),
                          message_identities=F.col("items.message_identity"),
                          confirm_mode_publishes=F.col("n"), lockstep_publishes=F.col("lockstep"),
                          median_idle_seconds=seconds(F.col("median_idle_ns")),
                          publishes_per_second=F.when(span > 0, F.col("n") / span)),
    )
