"""The Prometheus recording and alerting rules, written once as Python data.

`python -m dashboards.rules` writes them to dashboards/generated/prometheus/ackscope.rules.yml
(committed; tests/test_rules.py fails when it is stale, checks it with promtool and runs the promtool
unit tests generated from the same data). Kubernetes-mixin style: `Amqp`-prefixed CamelCase alert
names, a `severity` label, `summary`, a `description` naming where (vhost and application), and a
`runbook_url` to a section of dashboards/RUNBOOK.md.

An alert is fed by one or more *signals*, joined with `or`: the agent's live gauges and counters
(scraped) and the pushed analysis (metric_names.py says which is which), so it fires from whichever
part of ackscope is deployed. Each signal carries the test input that makes it hold and the input
just on the other side of its threshold: the promtool tests are built from them, so no signal is
without its two cases. Thresholds and `for` durations come from alert_settings.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field

import yaml

from analyzer import metric_names, schema

from .alert_settings import AlertSettings

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated", "prometheus", "ackscope.rules.yml")
WHERE = "vhost, application"
# Label values the generated promtool tests use.
TEST_WHERE = {"vhost": "/", "application": "orders-api"}
TEST_GROUP = {"job": "ackscope-analysis", "lake": "/lakes/prod"}
TEST_AGENT = {"job": "ackscope-agent", "instance": "10.0.0.7:9187"}
TEST_STEPS = 120  # input samples, one a minute: longer than any window or `for` of the tests


@dataclass(frozen=True)
class Series:
    """One promtool input series: a selector and its values in promtool's expanding notation."""
    selector: str
    values: str


@dataclass(frozen=True)
class Signal:
    expr: str                   # a vector while the condition holds
    firing: tuple               # Series that make it hold from the first minute on
    quiet: tuple                # Series on the other side of the threshold: it never holds
    labels: dict                # the labels the alert then carries (besides alertname and severity)
    kind: str | None = None     # the finding kind it reads, if it reads the pushed findings
    starts_at: int = 0          # seconds into the firing input when it starts to hold (before: nothing)


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str


@dataclass(frozen=True)
class Alert:
    name: str                   # Amqp... CamelCase
    severity: str               # critical, warning, info
    for_setting: str            # the AlertSettings field holding its `for`, in seconds
    summary: str
    description: str            # Go template; only {{ $labels.NAME }} (rendered by the tests too)
    runbook: str                # anchor of its RUNBOOK.md section
    signals: tuple = field(default_factory=tuple)

    @property
    def expr(self) -> str:
        if len(self.signals) == 1:
            return self.signals[0].expr
        return "\nor\n".join(f"({s.expr})" for s in self.signals)


# -- signal builders: one per shape of condition --------------------------------------------------------

def _selector(name: str, labels: dict) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _constant(value: float) -> str:
    return f"{value:g}+0x{TEST_STEPS}"


def gauge_above(metric: str, threshold: float, aggregate: str = "max", matchers: str = "",
                series_labels: dict | None = None) -> Signal:
    """The live or pushed gauge of an application above the threshold."""
    labels = {**(series_labels or {}), **TEST_WHERE}
    return Signal(f"{aggregate} by ({WHERE}) ({metric}{matchers}) > {threshold:g}",
                  (Series(_selector(metric, labels), _constant(2 * threshold + 1)),),
                  (Series(_selector(metric, labels), _constant(threshold)),),
                  dict(TEST_WHERE))


def counter_increase(metric: str, window: str) -> Signal:
    """An agent counter of an application that grew within the window (a counted fact: > 0)."""
    selector = _selector(metric, {**TEST_AGENT, **TEST_WHERE})
    return Signal(f"sum by ({WHERE}) (increase({metric}[{window}])) > 0",
                  (Series(selector, f"0+1x{TEST_STEPS}"),), (Series(selector, _constant(0)),), dict(TEST_WHERE))


def counter_born(metric: str, window_seconds: int) -> Signal:
    """An agent counter of an application whose series appeared within the window already above 0.
    The agent zeroes an application's counters at its connection.open, but a connection that opens
    and loses between two scrapes is first scraped counted, and increase() cannot count a series'
    first sample. Only where Prometheus scraped that agent a window ago: a new Prometheus or a new
    target sees every counter for the first time, and must not take old counts for new ones (an agent
    that restarted is still that target: its counters are new, and so is what they count)."""
    window = duration(window_seconds)
    selector = _selector(metric, {**TEST_AGENT, **TEST_WHERE})
    up = Series(_selector("up", TEST_AGENT), _constant(1))
    born = window_seconds // 60 + 1  # the input's minute when the series appears: up is a window old
    return Signal(f"sum by ({WHERE}) (({metric} unless {metric} offset {window}) "
                  f"and on (job, instance) up offset {window}) > 0",
                  (up, Series(selector, f"_x{born} 3+0x{TEST_STEPS - born}")),
                  (up, Series(selector, _constant(3))),  # already counted when Prometheus first saw the agent
                  dict(TEST_WHERE), starts_at=born * 60)


def recorded_above(record: str, counter: str, per_second: float) -> Signal:
    """A recorded per-application rate above the threshold. The firing input grows ten times faster
    than the threshold: a rate over a window that has only started filling reads low."""
    selector = _selector(counter, {**TEST_AGENT, **TEST_WHERE})
    return Signal(f"{record} > {per_second:g}",
                  (Series(selector, f"0+{60 * 10 * per_second:g}x{TEST_STEPS}"),),
                  (Series(selector, f"0+{60 * per_second / 2:g}x{TEST_STEPS}"),), dict(TEST_WHERE))


def finding(kind: str, measure: str = "ackscope_findings") -> Signal:
    """The pushed analysis holds findings of this kind (the detectors decided them)."""
    if kind not in schema.FINDING_KINDS:
        raise ValueError(f"unknown finding kind {kind!r}")
    severity = _KIND_SEVERITY[kind]
    selector = _selector(measure, {**TEST_GROUP, "kind": kind, "severity": severity, **TEST_WHERE})
    return Signal(f'sum by ({WHERE}) ({measure}{{kind="{kind}"}}) > 0',
                  (Series(selector, _constant(3)),), (Series(selector, _constant(0)),), dict(TEST_WHERE), kind)


def agent_counter(metric: str, window: str, matchers: str = "", extra: dict | None = None) -> Signal:
    """One of the agent's own counters grew within the window (per agent instance)."""
    selector = _selector(metric, {**TEST_AGENT, **(extra or {})})
    return Signal(f"sum by (job, instance) (increase({metric}{matchers}[{window}])) > 0",
                  (Series(selector, f"0+1x{TEST_STEPS}"),), (Series(selector, _constant(0)),), dict(TEST_AGENT))


_KIND_SEVERITY = schema.FINDING_SEVERITY


# -- the rules ---------------------------------------------------------------------------------------

def alerts_of_kind(settings: AlertSettings | None = None) -> dict[str, list[str]]:
    """Finding kind -> the alerts its findings raise."""
    found: dict[str, list[str]] = {}
    for alert in alerts(settings if settings is not None else AlertSettings()):
        for signal in alert.signals:
            if signal.kind:
                found.setdefault(signal.kind, []).append(alert.name)
    return found


def recording_rules() -> list[Recording]:
    def p99(histogram: str, rated: bool) -> str:
        buckets = f"rate({histogram}_bucket[5m])" if rated else f"{histogram}_bucket"
        return f"histogram_quantile(0.99, sum by (le, {WHERE}) ({buckets}))"

    return [
        Recording("ackscope:findings:sum", "sum by (kind, severity) (ackscope_findings)"),
        Recording("ackscope:publish_confirm_seconds:p99_5m", p99("ackscope_publish_confirm_seconds", True)),
        Recording("ackscope:deliver_ack_seconds:p99_5m", p99("ackscope_deliver_ack_seconds", True)),
        Recording("ackscope:requeues:rate5m", f"sum by ({WHERE}) (rate(ackscope_requeues_total[5m]))"),
        Recording("ackscope:redeliveries:rate5m", f"sum by ({WHERE}) (rate(ackscope_redeliveries_total[5m]))"),
        Recording("ackscope:lost_confirms:increase1h",
                  f"sum by ({WHERE}) (increase(ackscope_lost_confirms_total[1h]))"),
        # The pushed histograms describe the whole analysed data, not a rate: no rate() over them.
        Recording("ackscope:analysis_publish_confirm_seconds:p99",
                  p99("ackscope_analysis_publish_confirm_seconds", False)),
        Recording("ackscope:analysis_deliver_ack_seconds:p99", p99("ackscope_analysis_deliver_ack_seconds", False)),
        Recording("ackscope:analysis:age_seconds",
                  "time() - max by (job, lake) (ackscope_analysis_last_success_timestamp_seconds)"),
    ]


def _where(what: str) -> str:
    return f"Application {{{{ $labels.application }}}} on vhost {{{{ $labels.vhost }}}}: {what[0].lower()}{what[1:]}"


def _confirm(kind: str) -> str:
    return f" Confirm and see the evidence with `ackscope findings --lake LAKE --kind {kind}`."


def alerts(s: AlertSettings) -> list[Alert]:
    agent_up = f'up{{job="{s.agent_job}"}}'
    return [
        Alert("AmqpLostConfirms", "critical", "lost_confirms_for_seconds",
              "Publishes lost before their publisher confirm.",
              _where("Channels or connections closed with confirm-mode publishes unconfirmed: the broker never "
                     "took responsibility for them and the publisher must republish") + "." + _confirm("lost_confirm"),
              "amqplostconfirms",
              (Signal("ackscope:lost_confirms:increase1h > 0",
                      (Series(_selector("ackscope_lost_confirms_total", {**TEST_AGENT, **TEST_WHERE}),
                              f"0+1x{TEST_STEPS}"),),
                      (Series(_selector("ackscope_lost_confirms_total", {**TEST_AGENT, **TEST_WHERE}),
                              _constant(0)),), dict(TEST_WHERE)),
               counter_born("ackscope_lost_confirms_total", s.new_series_window_seconds),
               finding("lost_confirm", "ackscope_finding_items"))),
        Alert("AmqpBrokerNacks", "warning", "broker_nacks_for_seconds",
              "The broker nacked published messages.",
              _where("The broker refused responsibility for publishes (basic.nack): queue length limits with "
                     "reject-publish, or an internal error") + "." + _confirm("confirm_nack"),
              "amqpbrokernacks",
              (counter_increase("ackscope_confirm_nacks_total", "15m"),
               counter_born("ackscope_confirm_nacks_total", s.new_series_window_seconds),
               finding("confirm_nack", "ackscope_finding_items"))),
        Alert("AmqpUnackedBuildup", "warning", "unacked_buildup_for_seconds",
              "Deliveries are piling up unacknowledged.",
              _where(f"More than {s.unacked_deliveries} manual-ack deliveries unacked at once, or a consumer "
                     "stalled at its prefetch limit: the consumer is slow or stuck") + "." + _confirm("unacked_buildup"),
              "amqpunackedbuildup",
              (gauge_above("ackscope_unacked_deliveries", s.unacked_deliveries, "sum", series_labels=TEST_AGENT),
               finding("unacked_buildup"))),
        Alert("AmqpOldestUnackedTooOld", "warning", "oldest_unacked_for_seconds",
              "A delivery has stayed unacknowledged too long.",
              _where(f"The oldest unacked delivery is older than {s.oldest_unacked_seconds:g} s: a handler is stuck "
                     "or never acks on some code path") + "." + _confirm("unacked_buildup"),
              "amqpoldestunackedtooold",
              (gauge_above("ackscope_oldest_unacked_seconds", s.oldest_unacked_seconds, series_labels=TEST_AGENT),
               gauge_above("ackscope_analysis_oldest_unacked_seconds", s.oldest_unacked_seconds,
                           series_labels=TEST_GROUP))),
        Alert("AmqpRequeueLoop", "warning", "requeue_loop_for_seconds",
              "Messages are bouncing in a requeue loop.",
              _where("A consumer keeps nacking or rejecting messages with requeue=true (or they cycle through "
                     "dead-lettering): they come straight back") + "." + _confirm("requeue_loop"),
              "amqprequeueloop",
              (recorded_above("ackscope:requeues:rate5m", "ackscope_requeues_total", s.requeues_per_second),
               finding("requeue_loop"))),
        Alert("AmqpUnknownDeliveryTags", "critical", "unknown_delivery_tags_for_seconds",
              "A client acknowledged delivery tags that were not outstanding.",
              _where("Double acks, acks of tags never delivered or acks on the wrong channel: the broker closes the "
                     "channel (406 PRECONDITION_FAILED) and requeues its unacked deliveries") + "."
              + _confirm("unknown_delivery_tag"),
              "amqpunknowndeliverytags",
              (counter_increase("ackscope_unknown_delivery_tags_total", "15m"),
               counter_born("ackscope_unknown_delivery_tags_total", s.new_series_window_seconds),
               finding("unknown_delivery_tag"))),
        Alert("AmqpRedeliveryAfterClose", "warning", "redelivery_after_close_for_seconds",
              "Deliveries unacked at a channel close were delivered again.",
              _where("A consumer closed its channel or connection with work in hand; the messages were redelivered, "
                     "so work may be done twice") + "." + _confirm("redelivery_after_close"),
              "amqpredeliveryafterclose", (finding("redelivery_after_close"),)),
        Alert("AmqpUnboundedPrefetch", "warning", "unbounded_prefetch_for_seconds",
              "A manual-ack consumer has no prefetch limit.",
              _where("A consumer acks manually without basic.qos: the broker pushes the whole queue at it")
              + "." + _confirm("unbounded_prefetch"),
              "amqpunboundedprefetch",
              (Signal(f"min by ({WHERE}) (ackscope_prefetch_limit) == 0",
                      (Series(_selector("ackscope_prefetch_limit", {**TEST_AGENT, **TEST_WHERE}), _constant(0)),),
                      (Series(_selector("ackscope_prefetch_limit", {**TEST_AGENT, **TEST_WHERE}), _constant(1)),),
                      dict(TEST_WHERE)),
               finding("unbounded_prefetch"))),
        Alert("AmqpFlowBlocked", "warning", "flow_blocked_for_seconds",
              "The broker is holding publishers back (flow control).",
              _where("connection.blocked or channel.flow: the broker stopped reading from publishers, usually a "
                     "memory or disk alarm") + "." + _confirm("flow_blocked"),
              "amqpflowblocked",
              (gauge_above("ackscope_connection_blocked", 0, series_labels=TEST_AGENT), finding("flow_blocked"))),
        Alert("AmqpOutOfOrderConfirms", "info", "out_of_order_confirms_for_seconds",
              "Publisher confirms arrive out of publish order.",
              _where("Normal with persistent and transient messages mixed; a problem only for a publisher that "
                     "matches confirms by position instead of by tag") + "." + _confirm("out_of_order_confirm"),
              "amqpoutoforderconfirms",
              (counter_increase("ackscope_out_of_order_confirms_total", "1h"),
               counter_born("ackscope_out_of_order_confirms_total", s.new_series_window_seconds),
               finding("out_of_order_confirm"))),
        Alert("AmqpAgentKernelDrops", "warning", "agent_kernel_drops_for_seconds",
              "The kernel dropped packets before the ackscope agent read them.",
              "Agent {{ $labels.instance }} (job {{ $labels.job }}) lost packets to kernel drops: its gauges and "
              "tables miss frames, so its findings may be incomplete.",
              "amqpagentkerneldrops", (agent_counter("ackscope_agent_kernel_drops_total", "10m"),)),
        Alert("AmqpAgentDown", "warning", "agent_down_for_seconds",
              "No ackscope agent is being scraped.",
              f"Agent {{{{ $labels.instance }}}} of job {{{{ $labels.job }}}} is down, or Prometheus has no target "
              f"for job {s.agent_job}: live AMQP traffic is not watched.",
              "amqpagentdown",
              (Signal(f"{agent_up} == 0", (Series(_selector("up", TEST_AGENT | {"job": s.agent_job}), _constant(0)),),
                      (Series(_selector("up", TEST_AGENT | {"job": s.agent_job}), _constant(1)),),
                      TEST_AGENT | {"job": s.agent_job}),
               Signal(f"absent({agent_up})", (Series(_selector("up", {"job": "something-else"}), _constant(1)),),
                      (Series(_selector("up", TEST_AGENT | {"job": s.agent_job}), _constant(1)),),
                      {"job": s.agent_job}))),
        Alert("AmqpAgentFlushFailing", "warning", "agent_flush_failing_for_seconds",
              "The ackscope agent cannot write to the lake.",
              "Agent {{ $labels.instance }} (job {{ $labels.job }}) has flushes failing or rows dropped: "
              "the lake is missing what it captured.",
              "amqpagentflushfailing",
              (agent_counter("ackscope_agent_flushes_total", "15m", f'{{outcome="{metric_names.FLUSH_FAILED}"}}',
                             {"outcome": metric_names.FLUSH_FAILED}),
               agent_counter("ackscope_agent_rows_dropped_total", "15m", "", {"table": "frames"}))),
        Alert("AmqpAnalysisStale", "warning", "analysis_stale_for_seconds",
              "The scheduled ackscope analysis has not succeeded recently.",
              f"The last successful analysis of lake {{{{ $labels.lake }}}} (job {{{{ $labels.job }}}}) is older "
              f"than {duration(s.analysis_stale_seconds)}: the scheduled job stopped or keeps failing, and the findings "
              "in Prometheus are old.",
              "amqpanalysisstale",
              (Signal(f"ackscope:analysis:age_seconds > {s.analysis_stale_seconds}",
                      (Series(_selector("ackscope_analysis_last_success_timestamp_seconds", TEST_GROUP),
                              f"{-s.analysis_stale_seconds - 60}+0x{TEST_STEPS}"),),
                      (Series(_selector("ackscope_analysis_last_success_timestamp_seconds", TEST_GROUP),
                              f"0+60x{TEST_STEPS}"),),
                      dict(TEST_GROUP)),)),
        Alert("AmqpAnalysisFailing", "warning", "analysis_failing_for_seconds",
              "The ackscope analysis failed.",
              "The last analysis of lake {{ $labels.lake }} (job {{ $labels.job }}) failed: see the job's log; "
              "the findings in Prometheus are those of the last good run.",
              "amqpanalysisfailing",
              (Signal("max by (job, lake) (ackscope_analysis_failures) > 0",
                      (Series(_selector("ackscope_analysis_failures", TEST_GROUP), _constant(1)),),
                      (Series(_selector("ackscope_analysis_failures", TEST_GROUP), _constant(0)),),
                      dict(TEST_GROUP)),)),
    ]


# -- output -------------------------------------------------------------------------------------------

def duration(seconds: int) -> str:
    """Prometheus duration text: 900 -> 15m, 3600 -> 1h, 90 -> 90s."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def alert_rule(alert: Alert, settings: AlertSettings) -> dict:
    rule = {"alert": alert.name, "expr": alert.expr}
    for_seconds = getattr(settings, alert.for_setting)
    if for_seconds:
        rule["for"] = duration(for_seconds)
    rule["labels"] = {"severity": alert.severity}
    rule["annotations"] = {"summary": alert.summary, "description": alert.description,
                           "runbook_url": f"{settings.runbook_url}#{alert.runbook}"}
    return rule


def rules_document(settings: AlertSettings | None = None) -> dict:
    settings = settings if settings is not None else AlertSettings()
    return {"groups": [
        {"name": "ackscope.rules", "rules": [{"record": r.record, "expr": r.expr} for r in recording_rules()]},
        {"name": "ackscope.alerts", "rules": [alert_rule(a, settings) for a in alerts(settings)]},
    ]}


class _Literal(str):
    """Multi-line text written as a YAML block (|), as people write PromQL."""


yaml.SafeDumper.add_representer(
    _Literal, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|"))


def _blocks(node):
    if isinstance(node, dict):
        return {k: _blocks(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_blocks(v) for v in node]
    if isinstance(node, str) and "\n" in node:
        return _Literal(node)
    return node


def rules_yaml(settings: AlertSettings | None = None) -> str:
    header = ("# Generated by `python -m dashboards.rules` from dashboards/rules.py: do not edit.\n"
              + ("" if settings is None or settings == AlertSettings() else
                 "# Settings: " + ", ".join(f"{k}={getattr(settings, k)}" for k in AlertSettings.names()
                                            if getattr(settings, k) != getattr(AlertSettings(), k)) + "\n"))
    return header + yaml.safe_dump(_blocks(rules_document(settings)), sort_keys=False, width=110)


TEMPLATE = re.compile(r"\{\{ \$labels\.([a-z_]+) \}\}")


def render(template: str, labels: dict) -> str:
    """An annotation as Prometheus renders it, for the templates these rules use ({{ $labels.x }} only)."""
    rest = TEMPLATE.sub("", template)
    if "{{" in rest or "}}" in rest:
        raise ValueError(f"only {{{{ $labels.NAME }}}} is rendered in tests: {template!r}")
    return TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), template)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.rules", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=OUTPUT, help="default: %(default)s")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="another threshold or for (repeatable); see dashboards/alert_settings.py")
    args = parser.parse_args(argv)
    try:
        settings = AlertSettings.from_pairs(args.set)
    except ValueError as exc:
        print(f"dashboards.rules: {exc}", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as out:
        out.write(rules_yaml(settings))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
