"""The findings a run must compute again after it analysed some connections, and which stored
findings they replace: a scheduled run's detectors read what the run touched, not the whole lake.

Most kinds are about one connection (analyzer/detectors): their findings depend on its own rows
only, so the caller computes them again for the analysed connections (the pass for the connections
it analysed whole, stored_findings.py for those it carried on) and hands them in.
The two kinds that follow a message across connections (messages.py) depend on the deliveries of
its messages, wherever they are: only the delivery rows the run wrote (`changed`) can change them.
- requeue_loop, one finding per message: computed again for every message identity of a changed
  delivery, from all the deliveries of those identities;
- redelivery_after_close, one finding per closed channel incarnation: computed again for the
  incarnations with a changed closed delivery, and for those elsewhere whose unacked messages came
  back (redelivered) in a changed delivery, from their deliveries and every delivery of the same
  messages.
Every other stored finding stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.detectors import KINDS
from spark_jobs.delta_io import Listed, Match, connections_match
from spark_jobs.thresholds import Thresholds
from spark_jobs.timeline.plans import lookup, materialised

from . import DETECTORS
from .common import INCARNATION, finish
from .messages import CLOSED

ACROSS_CONNECTIONS = tuple(DETECTORS)

Tables = dict[str, DataFrame]


@dataclass
class RescopedFindings:
    findings: DataFrame          # rows of schema.FINDINGS computed again
    replaces: list[Match | Listed]   # the stored findings they take the place of


def rescoped_findings(tables: Tables, analysed: list[str], changed: DataFrame, own_findings: DataFrame,
                      thresholds: Thresholds) -> RescopedFindings:
    """`tables`: the detectors' inputs (detectors.INPUTS) as stored after the run's timelines;
    `analysed`: the connections the run analysed; `changed`: the
    delivery rows the run wrote (every row of a connection analysed whole; a carried connection's
    new and rewritten rows: the rows they replace have the same keys and messages);
    `own_findings`: the findings about one connection (analyzer.detectors.KINDS) of the analysed
    connections."""
    parts = [own_findings]
    replaces = [connections_match(changed.sparkSession, analysed, kind=KINDS)]

    known = tables["deliveries"].filter(F.col("message_identity").isNotNull())
    analysed_deliveries = changed.filter(F.col("message_identity").isNotNull())

    messages, messages_rows = _counted(analysed_deliveries.select("message_identity").distinct())
    journeys = known.join(messages, on="message_identity", how="left_semi")
    loops = DETECTORS["requeue_loop"]({**tables, "deliveries": journeys}, thresholds)
    replaces.append(Match(messages.withColumn("kind", F.lit("requeue_loop")), ("kind", "message_identity"),
                          rows=messages_rows))

    came_back = analysed_deliveries.filter(F.col("redelivered") == True).select("message_identity")  # noqa: E712
    closed = known.filter(F.col("outcome").isin(*CLOSED) & F.col("settle_ts_ns").isNotNull())
    changed_closed = analysed_deliveries.filter(F.col("outcome").isin(*CLOSED) & F.col("settle_ts_ns").isNotNull())
    places, places_rows = _counted(
        changed_closed.select(*INCARNATION)
        .unionByName(closed.join(came_back, on="message_identity", how="left_semi").select(*INCARNATION))
        .select(*INCARNATION).distinct())
    closed_there = closed.join(places, on=INCARNATION, how="left_semi").select("message_identity").distinct()
    involved = known.join(closed_there, on="message_identity", how="left_semi")
    # Incarnations outside `places` may share a message with them: their findings would be partial.
    found = DETECTORS["redelivery_after_close"]({**tables, "deliveries": involved}, thresholds)
    # Both kinds finished together: one look-up of their evidence packets in `frames`.
    parts.append(finish(loops.unionByName(found.join(places, on=INCARNATION, how="left_semi")),
                        tables["frames"], tables["connections"]))
    replaces.append(Match(places.withColumn("kind", F.lit("redelivery_after_close")), ("kind", *INCARNATION),
                          rows=places_rows))

    findings = parts[0]
    for part in parts[1:]:
        findings = findings.unionByName(part)
    return RescopedFindings(findings, replaces)


def _counted(keys: DataFrame) -> tuple[DataFrame, int]:
    """`keys` materialised, marked for broadcast if small, and how many rows it has (counted once,
    for the look-up here and for the replacement's)."""
    keys = materialised(keys)
    rows = keys.count()
    return lookup(keys, rows), rows
