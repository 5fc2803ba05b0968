"""Findings against a lab expectations document (NAME.expected.json, see tests/lab/expectations.py).

`problems(findings, expected)` lists every way the findings of one capture miss what the lab
says a correct analysis must find; an empty list means they hold. Pass only that capture's
findings (rows of schema.FINDINGS as dicts): `forbid` means absent from everything passed.

- `expect`: the sum of `count` of findings with that kind and connection_name (and channel, when
  given, and the detail below, when given) is at least `min_count`.
  Details checked: `message_id` (the finding's message), `redelivered_on` (a connection the
  messages came back on), `case` (which violation an unknown_delivery_tag is). Other keys
  (`observed_count`, `counts`, `evidence_frames`, ...) describe, they do not constrain.
- `forbid`: no finding of that kind at all.
- `forbid_on`: no finding of that kind on that connection_name.

LAB_THRESHOLDS are the detector thresholds at the lab's scale: its captures last seconds, so a
"stuck" delivery is unacked for a second, not minutes. They sit between what the lab calls near
a kind and what it calls clear (tests/lab/evidence.py), so the lab neither expects anything
borderline nor forbids anything they would catch.
"""

from __future__ import annotations

import json

from analyzer.detectors.thresholds import Thresholds

LAB_THRESHOLDS = Thresholds(
    unacked_age_seconds=1.2,          # evidence: near 1.0 s, clear 1.5 s
    prefetch_stall_seconds=0.6,       # at the limit, no ack: the stuck lab consumer sits there 1.3 s
    requeue_loop_deliveries=5,        # near 3, clear 10
    dead_letter_loop_count=5,
    synchronous_min_publishes=20,     # near 10 publishes at half lockstep, clear 30 at 90 %
    synchronous_min_share=0.75,
    synchronous_max_idle_seconds=0.05,
)

# The lab's words for the three unknown_delivery_tag cases -> the timeline's violation kinds.
VIOLATION_CASES = {"double ack": "double_ack", "never delivered": "unknown_tag",
                   "ack on another channel": "wrong_channel"}


def problems(findings: list[dict], expected: dict) -> list[str]:
    found = []
    for entry in expected.get("expect", []):
        matching = [f for f in findings if _matches(f, entry)]
        total = sum(f["count"] or 0 for f in matching)
        if total < entry["min_count"]:
            same_kind = [_describe(f) for f in findings if f["kind"] == entry["kind"]]
            found.append(f"expected {entry['kind']} on {_where(entry)} with count >= {entry['min_count']}, "
                         f"found {total}" + (f"; findings of that kind: {same_kind}" if same_kind else ""))
    for kind in expected.get("forbid", []):
        shown = [_describe(f) for f in findings if f["kind"] == kind]
        if shown:
            found.append(f"{kind} is forbidden in this capture, but found: {shown}")
    for entry in expected.get("forbid_on", []):
        shown = [_describe(f) for f in findings
                 if f["kind"] == entry["kind"] and f["connection_name"] == entry["connection_name"]]
        if shown:
            found.append(f"{entry['kind']} is forbidden on {entry['connection_name']}, but found: {shown}")
    return found


def _matches(finding: dict, entry: dict) -> bool:
    if finding["kind"] != entry["kind"] or finding["connection_name"] != entry["connection_name"]:
        return False
    if "channel" in entry and finding["channel"] != entry["channel"]:
        return False
    evidence = json.loads(finding["evidence"] or "{}")
    if "message_id" in entry and entry["message_id"] not in (evidence.get("message_id"),
                                                             finding.get("message_identity")):
        return False
    if "redelivered_on" in entry and entry["redelivered_on"] not in evidence.get("redelivered_on", []):
        return False
    if "case" in entry:
        wanted = VIOLATION_CASES.get(entry["case"])
        if wanted is None:
            raise ValueError(f"unknown unknown_delivery_tag case {entry['case']!r}: one of {sorted(VIOLATION_CASES)}")
        if wanted not in evidence.get("violations", []):
            return False
    return True


def _where(entry: dict) -> str:
    where = entry["connection_name"] + ("" if "channel" not in entry else f" channel {entry['channel']}")
    details = {k: entry[k] for k in ("message_id", "redelivered_on", "case") if k in entry}
    return where + (f" {details}" if details else "")


def _describe(finding: dict) -> str:
    return (f"{finding['kind']}({finding['severity']}) on {finding['connection_name'] or finding['connection_id']} "
            f"channel {finding['channel']} count {finding['count']}")


def findings_of_capture(lake_dir: str, capture: str) -> list[dict]:
    """The findings on the connections decoded from `capture` (the connections table's `source`):
    by connection, not by name, because a mid-stream capture has no names on the wire."""
    import os

    from analyzer import lake, schema
    from analyzer.findings import read_findings

    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS).to_pylist()
    ids = {c["connection_id"] for c in connections if os.path.abspath(c["source"]) == os.path.abspath(capture)}
    assert ids, f"no connection of {capture} in {lake_dir}"
    return [f for f in read_findings(lake_dir) if f["connection_id"] in ids]


def analysed_as_the_command_does(spark, lake_dir: str, thresholds: Thresholds | None = None):
    """The lake analysed as `ackscope analyze` on a local master does (the local executor where it
    takes the run, else Spark's), in the test session's Spark rather than a driver JVM of its own
    a run: for tests about what an analysis finds, not about the command. Its report."""
    from spark_jobs.analyze import analyze

    return analyze(spark, lake_dir, thresholds=thresholds, local=True)
