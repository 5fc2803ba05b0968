"""The findings a run must compute again after it analysed some connections, and which stored
findings they replace: a scheduled run's detectors read what the run touched, not the whole lake.

Most kinds are about one connection (analyzer/detectors): their findings depend on its own rows
only, so the caller computes them again for the analysed connections (the pass for the connections
it analysed whole, stored_findings.py for those it carried on) and hands them in.
The two kinds that follow a message across connections (messages.py) reach further:
- requeue_loop, one finding per message: computed again for every message identity the analysed
  connections delivered, from all the deliveries of those identities;
- redelivery_after_close, one finding per closed channel incarnation: computed again for the
  incarnations that were analysed, and for those elsewhere whose unacked messages came back
  (redelivered) on an analysed connection, from their deliveries and every delivery of the same
  messages.
Every other stored finding stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.delta_io import Match
from spark_jobs.thresholds import Thresholds
from spark_jobs.timeline.plans import lookup

from . import DETECTORS, detect
from .common import INCARNATION
from .messages import CLOSED

ACROSS_CONNECTIONS = tuple(DETECTORS)

Tables = dict[str, DataFrame]


@dataclass
class RescopedFindings:
    findings: DataFrame          # rows of schema.FINDINGS computed again
    replaces: list[Match]        # the stored findings they take the place of


def rescoped_findings(tables: Tables, analysed: DataFrame, own_findings: DataFrame,
                      thresholds: Thresholds) -> RescopedFindings:
    """`tables`: the detectors' inputs (detectors.INPUTS) as stored after the run's timelines;
    `analysed`: one `connection_id` column, the connections the run analysed; `own_findings`: the
    findings about one connection (analyzer.detectors.KINDS) of those connections."""
    analysed = lookup(analysed.select("connection_id").distinct())
    parts = [own_findings]
    # Whatever kind: a finding of an analysed connection is computed again below, if it still holds.
    replaces = [Match(analysed, ("connection_id",))]

    known = tables["deliveries"].filter(F.col("message_identity").isNotNull())
    analysed_deliveries = tables["deliveries"].join(analysed, on="connection_id", how="left_semi").filter(F.col("message_identity").isNotNull())

    messages = lookup(analysed_deliveries.select("message_identity").distinct())
    journeys = known.join(messages, on="message_identity", how="left_semi")
    parts.append(detect({**tables, "deliveries": journeys}, thresholds, kinds=["requeue_loop"]))
    replaces.append(Match(messages.withColumn("kind", F.lit("requeue_loop")), ("kind", "message_identity")))

    came_back = analysed_deliveries.filter(F.col("redelivered") == True).select("message_identity")  # noqa: E712
    closed = known.filter(F.col("outcome").isin(*CLOSED) & F.col("settle_ts_ns").isNotNull())
    places = lookup(closed.join(analysed, on="connection_id", how="left_semi")
                    .unionByName(closed.join(came_back, on="message_identity", how="left_semi"))
                    .select(*INCARNATION).distinct())
    closed_there = closed.join(places, on=INCARNATION, how="left_semi").select("message_identity").distinct()
    involved = known.join(closed_there, on="message_identity", how="left_semi")
    # Incarnations outside `places` may share a message with them: their findings would be partial.
    found = detect({**tables, "deliveries": involved}, thresholds, kinds=["redelivery_after_close"])
    parts.append(found.join(places, on=INCARNATION, how="left_semi"))
    replaces.append(Match(places.withColumn("kind", F.lit("redelivery_after_close")), ("kind", *INCARNATION)))

    findings = parts[0]
    for part in parts[1:]:
        findings = findings.unionByName(part)
    return RescopedFindings(findings, replaces)
