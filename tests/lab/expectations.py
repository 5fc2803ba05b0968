"""What a correct analysis of a lab capture must find, built from the capture's own evidence.

Written next to each capture as NAME.expected.json:

    {"scenario": NAME, "description": ...,
     "expect": [{"kind", "connection_name", "channel", "min_count", "observed_count", "counts",
                 "evidence_frames", ...}],
     "forbid": [kind, ...],          # must not be found anywhere in the capture
     "forbid_on": [{"kind", "connection_name"}],  # must not be found on that connection
     "facts": {...}}

`min_count` bounds the sum of the `count` of the matching findings (so one finding per channel
or one per message both work); `counts` says what is counted. For the kinds with no exact line
(see evidence.py) `min_count` is the scenario's floor, well under what was observed; otherwise
it is exactly what the raw frames show. Every kind is either expected, forbidden, or listed in
facts["tolerated"] with the reason the traffic leaves it open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.lab.errors import NotObserved
from tests.lab.evidence import COUNTS, FINDING_KINDS, Evidence

FUZZY_KINDS = {"synchronous_confirms", "unacked_buildup", "requeue_loop"}

EvidenceByKind = dict[str, list[Evidence]]


@dataclass
class Verdict:
    expect: list[dict]
    forbid_on: list[dict] = field(default_factory=list)
    tolerated: dict[str, str] = field(default_factory=dict)  # kind -> why it is left open
    facts: dict = field(default_factory=dict)


def require(condition: bool, what: str) -> None:
    """A scenario's own check on the raw frames."""
    if not condition:
        raise NotObserved(what)


def expect(evidence: EvidenceByKind, kind: str, connection_name: str, channel: int | None = None,
           at_least: int = 1, **detail) -> dict:
    """The expectation that `kind` shows on this connection (and channel, and detail such as a
    message_id); raises NotObserved unless the raw frames show it clearly, `at_least` times."""
    matching = [e for e in evidence[kind] if e.clear and e.connection_name == connection_name
                and (channel is None or e.channel == channel)
                and all(e.detail.get(key) == value for key, value in detail.items())]
    observed = sum(e.count for e in matching)
    if observed < at_least:
        where = f"{connection_name}" + ("" if channel is None else f" channel {channel}")
        nearby = [e for e in evidence[kind] if e not in matching]
        raise NotObserved(f"{kind} on {where}: the capture shows {observed}, at least {at_least} needed"
                          + (f" (elsewhere: {nearby})" if nearby else ""))
    entry = {"kind": kind, "connection_name": connection_name}
    if channel is not None:
        entry["channel"] = channel
    entry.update(detail)
    entry.update(min_count=at_least if kind in FUZZY_KINDS else observed, observed_count=observed,
                 counts=COUNTS[kind], evidence_frames=sorted({n for e in matching for n in e.frames}))
    return entry


def forbid_on(evidence: EvidenceByKind, kind: str, connection_name: str) -> dict:
    shown = [e for e in evidence[kind] if e.connection_name == connection_name]
    if shown:
        raise NotObserved(f"{kind} must not show on {connection_name}, but the capture has {shown}")
    return {"kind": kind, "connection_name": connection_name}


def forbidden_kinds(verdict: Verdict, evidence: EvidenceByKind) -> list[str]:
    """Every kind neither expected nor tolerated, after checking that the capture has nothing
    of it, not even something near it."""
    left_open = {e["kind"] for e in verdict.expect} | set(verdict.tolerated)
    forbidden = [kind for kind in FINDING_KINDS if kind not in left_open]
    for kind in forbidden:
        if evidence[kind]:
            raise NotObserved(f"{kind} is not expected here, but the capture shows {evidence[kind]}")
    return forbidden


def expectations_document(name: str, description: str, verdict: Verdict, evidence: EvidenceByKind,
                          connections: dict[str, int]) -> dict:
    return {
        "scenario": name,
        "description": description,
        "expect": verdict.expect,
        "forbid": forbidden_kinds(verdict, evidence),
        "forbid_on": verdict.forbid_on,
        "facts": {"connections": connections, "tolerated": verdict.tolerated, **verdict.facts},
    }
