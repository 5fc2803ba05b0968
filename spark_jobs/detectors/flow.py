"""flow_blocked: the broker holding publishers back. One finding per connection that got
connection.blocked (a resource alarm: memory or disk), and one per channel incarnation paused by
a broker channel.flow active=false; each with how long until it was released. Read from the
frames: flow control is not part of the per-channel timelines.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.thresholds import Thresholds

from .common import INCARNATION, MAX_EVIDENCE, channel_ends, evidence, incarnation_of, raw_finding, seconds

Tables = dict[str, DataFrame]


def _episodes(signals: DataFrame, keys: list[str], starts: Column, releases: Column) -> DataFrame:
    """Per place (`keys`): the start signals, each with the first release after it (null if none
    came). Starts sharing a release are one episode, timed from the first of them."""
    after = Window.partitionBy(*keys).orderBy("seq").rowsBetween(1, Window.unboundedFollowing)
    release = F.first(F.when(releases, F.struct(F.col("seq").alias("seq"), F.col("ts_ns").alias("ts_ns"))),
                      ignorenulls=True).over(after)
    return (signals.withColumn("_release", release).filter(starts)
            .select(*keys, "agent_id", "seq", "ts_ns", "detail",
                    F.col("_release.seq").alias("release_seq"), F.col("_release.ts_ns").alias("release_ns")))


def _summarise(starts: DataFrame, keys: list[str], until: DataFrame) -> DataFrame:
    """Per place: signal count, total time held back (an unreleased episode runs to `until_ns`,
    the end of the data for that place), and the first episodes."""
    episodes = (starts.join(until, on=keys, how="left")
                .withColumn("_end_ns", F.coalesce("release_ns", "until_ns", "ts_ns"))
                .groupBy(*keys, "release_seq").agg(
                    F.min("agent_id").alias("agent_id"), F.count(F.lit(1)).alias("signals"),
                    F.min("seq").alias("seq"), F.min("ts_ns").alias("start_ns"), F.max("_end_ns").alias("end_ns"),
                    F.min_by("detail", "seq").alias("detail")))
    episodes = episodes.withColumn("_rank", F.row_number().over(Window.partitionBy(*keys).orderBy("seq")))
    return episodes.groupBy(*keys).agg(
        F.min("agent_id").alias("agent_id"),
        F.sum("signals").alias("n"),
        F.sum(F.col("end_ns") - F.col("start_ns")).alias("held_ns"),
        F.min("start_ns").alias("first_ns"), F.max("end_ns").alias("last_ns"),
        F.max(F.col("release_seq").isNull()).alias("still_blocked"),
        F.min_by("detail", "seq").alias("reason"),
        F.sort_array(F.collect_list(F.when(F.col("_rank") <= MAX_EVIDENCE, F.struct(
            F.col("seq").alias("blocked_seq"), F.col("release_seq").alias("unblocked_seq"),
            seconds(F.col("end_ns") - F.col("start_ns")).alias("seconds"))))).alias("episodes"),
    )


def _evidence_seqs() -> Column:
    # The blocking and releasing frames themselves, in order, for Wireshark.
    both = F.concat(F.col("episodes.blocked_seq"), F.col("episodes.unblocked_seq"))
    return F.slice(F.array_sort(F.array_distinct(F.array_compact(both))), 1, MAX_EVIDENCE)


def _connection_blocked(tables: Tables) -> DataFrame:
    signals = tables["frames"].filter((F.col("direction") == "to_client")
                                      & F.col("method").isin("connection.blocked", "connection.unblocked"))
    starts = _episodes(signals, ["connection_id"], F.col("method") == "connection.blocked",
                       F.col("method") == "connection.unblocked")
    until = tables["connections"].groupBy("connection_id").agg(F.max("last_ts_ns").alias("until_ns"))
    found = _summarise(starts, ["connection_id"], until)
    still = F.when(F.col("still_blocked"), F.lit(", and was still blocked when the data ended")).otherwise(F.lit(""))
    return raw_finding(
        found, "flow_blocked", channel=F.lit(0), incarnation=F.lit(None),
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        value=seconds(F.col("held_ns")),
        summary=F.concat(F.format_string(
            "The broker blocked this connection's publishing %d times (connection.blocked: %s) for %.1f s in all",
            F.col("n"), F.coalesce("reason", F.lit("no reason given")), seconds(F.col("held_ns"))), still,
            F.lit(": a resource alarm (memory or disk) on the broker")),
        evidence=evidence(seqs=_evidence_seqs(), episodes=F.col("episodes"), reason=F.col("reason"),
                          still_blocked=F.col("still_blocked")),
    )


def _channel_paused(tables: Tables) -> DataFrame:
    flows = tables["frames"].filter((F.col("direction") == "to_client") & (F.col("method") == "channel.flow"))
    flows = incarnation_of(flows, tables["channels"]).filter(F.col("incarnation").isNotNull())
    starts = _episodes(flows, INCARNATION, F.col("active") == False, F.col("active") == True)  # noqa: E712
    until = channel_ends(tables["channels"]).select(*INCARNATION, F.col("in_view_until_ns").alias("until_ns"))
    found = _summarise(starts, INCARNATION, until)
    still = F.when(F.col("still_blocked"), F.lit(", and it was still paused when the data ended")).otherwise(F.lit(""))
    return raw_finding(
        found, "flow_blocked",
        first_ts_ns=F.col("first_ns"), last_ts_ns=F.col("last_ns"), count=F.col("n"),
        value=seconds(F.col("held_ns")),
        summary=F.concat(F.format_string("The broker paused channel %d with channel.flow active=false %d times for "
                                         "%.1f s in all", F.col("channel"), F.col("n"), seconds(F.col("held_ns"))),
                         still),
        evidence=evidence(seqs=_evidence_seqs(), episodes=F.col("episodes"), still_blocked=F.col("still_blocked")),
    )


def flow_blocked(tables: Tables, thresholds: Thresholds) -> DataFrame:
    """The broker's flow control, whatever its length: even a short block stalls every publisher
    on the connection, and it means a broker resource alarm went off."""
    return _connection_blocked(tables).unionByName(_channel_paused(tables))
