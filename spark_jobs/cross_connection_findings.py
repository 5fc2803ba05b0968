"""The findings across connections, over Arrow: requeue_loop and redelivery_after_close
(analyzer/detectors/messages.py's rules) of the messages a run's changed rows can change, for both
executors (docs/analysis.md, "One implementation of the rules", 2, and "Incremental", Findings). An
incarnation's redelivery_after_close is computed whole: its finding names all its messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import groupby

import pyarrow as pa
import pyarrow.compute as pc

from analyzer import schema
from analyzer.detectors import RawFinding
from analyzer.detectors.common import nulls_first
from analyzer.detectors.messages import (COLUMNS, JOURNEY_ORDER, Journey, Redelivered, after_close_finding,
                                         candidates, left_at_close, redelivered_after_close)
from analyzer.detectors.thresholds import Thresholds

from .connection_pass import RAW_FINDINGS, raw_finding_rows

Place = tuple[str, int, int]   # (connection_id, channel, incarnation)
# The deliveries' columns the kinds read, as stored.
CANDIDATES = pa.schema([schema.DELIVERIES.field(name) for name in COLUMNS])


@dataclass(frozen=True)
class FoundAcross:
    raw: pa.Table             # the raw findings (connection_pass.RAW_FINDINGS), finished with the pass's
    messages: frozenset[str]  # the messages whose stored requeue_loop findings they replace
    places: frozenset[Place]  # the closed incarnations whose stored redelivery_after_close findings they replace


def candidates_of(deliveries: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
    """The rows of these deliveries either kind reads, in CANDIDATES' columns."""
    return deliveries.filter(candidates(deliveries)).select(COLUMNS)


def findings_across(stored: pa.Table, changed: pa.Table | None, connections: Callable[[set[str]], dict[str, dict]],
                    thresholds: Thresholds) -> FoundAcross:
    """The two kinds' raw findings of what `changed` can change, from `stored`, the deliveries as
    stored after the run's commits (only its candidates are read). `changed`: the delivery rows the
    run added or deleted (of a non-candidate row only the message identity is read); None: every
    stored candidate, a full run. `connections(ids)`: connection_pass.connection_facts of those."""
    rows = candidates_of(stored).to_pylist()
    if changed is None:
        changed_rows = rows
    else:
        known = changed.filter(pc.is_valid(changed["message_identity"]))
        changed_rows = (candidates_of(known).to_pylist()
                        + [{"message_identity": m} for m in pc.unique(known["message_identity"]).to_pylist()])
    came_back: dict[str, bool] = {}   # each changed message: did it come back (redelivered) in a changed row
    for d in changed_rows:
        came_back[d["message_identity"]] = came_back.get(d["message_identity"], False) or d.get("redelivered") is True

    journeys = [d for d in rows if d["message_identity"] in came_back]
    by_journey = sorted(journeys, key=lambda d: nulls_first(d[c] for c in ("message_identity", *JOURNEY_ORDER)))
    loops = [found for _, group in groupby(by_journey, key=lambda d: d["message_identity"])
             if (found := _journey(group, thresholds)) is not None]

    closed = [d for d in rows if left_at_close(d)]
    places = ({_place(d) for d in changed_rows if "outcome" in d and left_at_close(d)}
              | {_place(d) for d in closed if came_back.get(d["message_identity"], False)})
    closed_there = {d["message_identity"] for d in closed if _place(d) in places}
    involved = [d for d in rows if d["message_identity"] in closed_there
                and (left_at_close(d) or d["redelivered"] is True)]
    # The facts of every connection a finding or a redelivery names (an incarnation's finding is on one of those).
    named = {d["connection_id"] for d in involved} | {connection_id for connection_id, _ in loops}
    facts = connections(named) if named else {}
    involved = [{**d, "connection_name": facts.get(d["connection_id"], {}).get("connection_name")} for d in involved]
    matches = [m for _, group in groupby(sorted(involved, key=lambda d: nulls_first((d["message_identity"],))),
                                         key=lambda d: d["message_identity"])
               for m in redelivered_after_close(group)]
    by_place = sorted(matches, key=lambda m: nulls_first((*_as_place(m), m.seq)))
    after_close = [found for place, group in groupby(by_place, key=_as_place)
                   if place in places and (found := after_close_finding(group)) is not None]
    raw = [row for connection_id, finding in [*loops, *after_close]
           for row in raw_finding_rows(facts.get(connection_id, {"connection_id": connection_id}), [finding])]
    return FoundAcross(pa.Table.from_pylist(raw, schema=RAW_FINDINGS), frozenset(came_back), frozenset(places))


def _journey(deliveries: Iterable[dict], thresholds: Thresholds) -> tuple[str, RawFinding] | None:
    journey = Journey()
    for d in deliveries:
        journey.add(d)
    return journey.finding(thresholds)


def _place(d: dict) -> Place:
    return d["connection_id"], d["channel"], d["incarnation"]


def _as_place(m: Redelivered) -> Place:
    return m.connection_id, m.channel, m.incarnation


