"""What each finding kind means and what to do about it (analyzer/finding_advice.py, the README's
findings table), shown in the panels' descriptions (the (i) of a panel) so the dashboard answers
"so what?" where it is read."""

from __future__ import annotations

from analyzer.finding_advice import ADVICE

# The severity each detector gives its kind (spark_jobs/detectors/common.py, SEVERITY; tests/test_report.py
# checks the README's table against it), here without importing Spark.
SEVERITY = {
    "lost_confirm": "critical", "unknown_delivery_tag": "critical", "confirm_nack": "warning",
    "unacked_buildup": "warning", "requeue_loop": "warning", "redelivery_after_close": "warning",
    "unbounded_prefetch": "warning", "flow_blocked": "warning", "out_of_order_confirm": "info",
    "unroutable_returned": "info", "unconfirmed_persistent_publish": "info", "synchronous_confirms": "info",
}
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
