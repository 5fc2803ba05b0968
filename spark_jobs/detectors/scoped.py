"""The findings a run must compute again after it analysed some connections, and which stored
findings they replace: a scheduled run's detectors read what the run touched, not the whole lake.

Most kinds are about one connection (analyzer/detectors): their findings depend on its own rows
only, so the caller computes them again for the analysed connections (the pass for the connections
it analysed whole, stored_findings.py for those it carried on) and hands them in.
The two kinds that follow a message across connections (messages.py) read only the candidate
deliveries of its messages (messages.candidate: in a loop, or left at a close), wherever they are.
So a message's findings can change only where a run adds or deletes a candidate row of it: those
rows are `changed`. A connection analysed whole has all its rows deleted and written again, so
all the rows it wrote count (the ones deleted were rows of the same deliveries). A carried
connection deletes only the rows it writes again (the same keys, the same messages: incremental.py),
so its changed rows are the requeue_related ones among the rows it wrote and the rows they replace:
a row can stop being a candidate (a delivery left at a close whose client's bytes then go missing
is settled as unknown), and only the replaced row says where it was.
- requeue_loop, one finding per message: computed again for every message identity of a changed
  delivery, from the deliveries of those identities that can be in a loop (messages.in_loop);
- redelivery_after_close, one finding per closed channel incarnation: computed again for the
  incarnations with a changed closed delivery, and for those elsewhere whose unacked messages came
  back (redelivered) in a changed delivery, from their deliveries and every delivery of the same
  messages.
Every other stored finding stays as it was; so a run that changed no candidate (a lake without
requeues or redeliveries: most runs of most lakes) reads no deliveries for them at all.

Both kinds read the stored deliveries through one scan (`_candidates`, materialised): every
delivery that is in a loop or was left at a close (messages.candidate), which is all either kind
reads of any message, from only the files that can hold one (requeue_related.py). The rest are
joins among those few rows, made by shuffling them (`joined_by_shuffle`): without adaptive
execution each broadcast would be a Spark job of its own, and there would be one per join.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.detectors import KINDS
from spark_jobs.delta_io import Listed, Match, connections_match
from spark_jobs.evidence_packets import MeasuredFindings, measured_findings
from spark_jobs.session import expressions_for
from spark_jobs.thresholds import Thresholds
from spark_jobs.timeline.plans import joined_by_shuffle, measured, sized_shuffles

from . import DETECTORS
from .messages import INCARNATION, candidate, left_at_close

ACROSS_CONNECTIONS = tuple(DETECTORS)

Tables = dict[str, DataFrame]

# Candidates' marks: a delivery of a message a changed row names; that message came back
# (redelivered) in a changed row.
TOUCHED, CAME_BACK = "_touched", "_came_back"


@dataclass
class RescopedFindings:
    across: MeasuredFindings | None   # the message kinds' raw findings computed again (None: none can change)
    replaces: list[Match | Listed]   # the stored findings they and the analysed connections' own take the place of
    candidates: int              # the stored deliveries the kinds read


def rescoped_findings(tables: Tables, requeue_related: Callable[[], DataFrame], analysed: list[str],
                      changed: DataFrame, thresholds: Thresholds, changed_rows: int | None = None) -> RescopedFindings:
    """`tables`: the detectors' inputs (detectors.INPUTS) as stored after the run's timelines;
    `requeue_related`: reads the stored deliveries the kinds can read (requeue_related.py); `analysed`:
    the connections the run analysed; `changed`: the delivery rows the run added or deleted that
    can change what the kinds read (the module's docstring: every row a connection analysed whole
    wrote; a carried connection's requeue_related rows written and replaced), `changed_rows` of
    them if known (at most; 0: the kinds have nothing to do, and read nothing). The findings about one connection
    (analyzer.detectors.KINDS) of the analysed connections are the caller's;
    evidence_packets.finished_together finishes `across`."""
    spark = changed.sparkSession
    own = connections_match(spark, analysed, kind=KINDS)
    if changed_rows == 0:
        # No candidate of any message was added or deleted: every message kind's finding stands,
        # and the stored deliveries are not read.
        return RescopedFindings(None, [own], 0)
    changed = changed.filter(F.col("message_identity").isNotNull())
    messages = changed.groupBy("message_identity").agg(
        F.max(F.coalesce(F.col("redelivered") == True, F.lit(False))).alias(CAME_BACK))  # noqa: E712
    candidates, candidate_rows = _candidates(requeue_related(), messages)
    deliveries = [c for c in candidates.columns if c not in (TOUCHED, CAME_BACK)]

    journeys = candidates.filter(F.col(TOUCHED)).select(*deliveries)
    loops = DETECTORS["requeue_loop"]({**tables, "deliveries": journeys}, thresholds)

    closed = candidates.filter(left_at_close())
    places = (changed.filter(left_at_close()).select(*INCARNATION)
              .unionByName(closed.filter(F.col(CAME_BACK)).select(*INCARNATION)).distinct())
    closed_there = closed.join(places, on=INCARNATION, how="left_semi").select("message_identity").distinct()
    # Every closed and redelivered delivery of those messages: what the kind reads of them.
    involved = candidates.join(closed_there, on="message_identity", how="left_semi").select(*deliveries)
    # Incarnations outside `places` may share a message with them: their findings would be partial.
    found = DETECTORS["redelivery_after_close"]({**tables, "deliveries": involved}, thresholds)
    # The kinds read only the candidates: when they are few, compiling the expressions of their
    # plans costs the driver more than interpreting them over those rows, and a task per
    # partition of a table's size costs more than its share of them.
    with joined_by_shuffle(spark), expressions_for(spark, candidate_rows), sized_shuffles(spark, candidate_rows):
        across = measured_findings(loops.unionByName(found.join(places, on=INCARNATION, how="left_semi")))
    replaces = [own,
                Match(messages.select("message_identity").withColumn("kind", F.lit("requeue_loop")),
                      ("kind", "message_identity"), rows=changed_rows),
                Match(places.withColumn("kind", F.lit("redelivery_after_close")), ("kind", *INCARNATION))]
    return RescopedFindings(across, replaces, candidate_rows)


def message_kinds_deliveries(deliveries: DataFrame) -> DataFrame:
    """What either message kind reads of a whole deliveries table (a full run's `detect`; or of its
    requeue_related rows, which hold all of that), materialised: every delivery `candidate()`
    picks. The kinds find in it exactly what they find in the whole table."""
    candidates, _ = _candidates(deliveries, None)
    return candidates.select(*[c for c in candidates.columns if c not in (TOUCHED, CAME_BACK)])


def _candidates(deliveries: DataFrame, messages: DataFrame | None) -> tuple[DataFrame, int]:
    """The stored deliveries either kind can read (`candidate()`: in a loop, or left at a close),
    those of `messages` (message_identity, CAME_BACK; None: every message) marked TOUCHED, with
    CAME_BACK; materialised, and how many.

    One scan of the deliveries, never shuffling them: the filter leaves few rows, and only those
    meet `messages`, by shuffle (a run's changed messages can be hundreds of thousands, past what
    is broadcast, and a broadcast would be a Spark job of its own)."""
    found = deliveries.filter(candidate())
    if messages is None:
        marked = found.withColumn(CAME_BACK, F.lit(False)).withColumn(TOUCHED, F.lit(True))
    else:
        marked = (found.join(messages.withColumn(TOUCHED, F.lit(True)).hint("shuffle_hash"),
                             on="message_identity", how="left")
                  .withColumn(TOUCHED, F.coalesce(TOUCHED, F.lit(False)))
                  .withColumn(CAME_BACK, F.coalesce(CAME_BACK, F.lit(False))))
    with joined_by_shuffle(deliveries.sparkSession):
        candidates, seen = measured(marked, rows=F.count(F.lit(1)))
    # Columns of their own: the checkpoint keeps the stored table's, and the rows a run wrote for
    # connections analysed whole are read from that table too (Spark cannot join the two apart).
    return candidates.select(*[F.col(column).alias(column) for column in candidates.columns]), seen["rows"]
