"""The Prometheus recording rules the dashboards read instead of their raw, heavier queries.

The rules themselves are defined with the alerting rules (dashboards/generated/prometheus/
ackscope.rules.yml); these names and labels are the contract between the two, so a panel may use a
recording rule only if it is listed here, and a test checks every panel against this list and the
metric catalog (analyzer/metric_names.py).
"""

from __future__ import annotations

WHERE = ("vhost", "application")

RECORDING_RULES = {
    # sum by (kind, severity) (ackscope_findings): the findings of the latest analysis
    "ackscope:findings:sum": ("kind", "severity"),
    # p99 over 5 minutes of the agent's latency histograms
    "ackscope:publish_confirm_seconds:p99_5m": WHERE,
    "ackscope:deliver_ack_seconds:p99_5m": WHERE,
    # per-second rates over 5 minutes of the agent's counters
    "ackscope:requeues:rate5m": WHERE,
    "ackscope:redeliveries:rate5m": WHERE,
    # lost confirms the agent counted in the last hour
    "ackscope:lost_confirms:increase1h": WHERE,
}
