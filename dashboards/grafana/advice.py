"""What each finding kind means and what to do about it (analyzer/finding_advice.py, the README's
findings table), shown in the panels' descriptions (the (i) of a panel) so the dashboard answers
"so what?" where it is read."""

from __future__ import annotations

from analyzer.finding_advice import ADVICE
from analyzer.schema import FINDING_SEVERITY

SEVERITY = FINDING_SEVERITY
# kind -> (severity, what it means, what to do): the advice itself has one source, analyzer/finding_advice.py.
FINDINGS = {kind: (severity, *ADVICE[kind]) for kind, severity in SEVERITY.items()}

EVIDENCE = ("The evidence (connections, channels, delivery tags, message ids, capture packets) is not "
            "in Prometheus: `ackscope findings --lake DIR --kind KIND` prints it.")


def findings_table() -> str:
    """A markdown table of every kind, for the findings panels' descriptions."""
    rows = [f"| `{kind}` | {severity} | {meaning} | {action} |"
            for kind, (severity, meaning, action) in FINDINGS.items()]
    return "\n".join(["| kind | severity | what it means | what to do |", "| --- | --- | --- | --- |", *rows])


def about(kind: str) -> str:
    severity, meaning, action = FINDINGS[kind]
    return f"`{kind}` ({severity}): {meaning}. What to do: {action}."
