"""The drill-down: one vhost or application at a time (the `vhost` and `application` variables),
everything ackscope knows about it, live (agent) and at the end of the analysed data (analysis)."""

from __future__ import annotations

from . import advice, variables
from .layout import assemble, new_dashboard
from .panels import (COUNT, PER_SECOND, SECONDS, bars_panel, instant, query, table_query, table_panel,
                     thresholds, timeseries_panel)
from .promql import WHERE

UID = "ackscope-drilldown"
SEL = "{" + WHERE + "}"
BY_APP = "{{application}}"


def findings_here():
    return table_panel(
        "Findings", "Findings of the latest analysis for the selected vhosts and applications, by kind "
        "and severity (Value: how many).\n\n" + advice.findings_table() + "\n\n" + advice.EVIDENCE,
        COUNT, table_query(f"sum by (application, kind, severity) (ackscope_findings{SEL})"))


def finding_items():
    return bars_panel(
        "What the findings count", "What the findings count, summed by kind: lost publishes, nacked "
        "publishes, bad acks, requeued deliveries, redeliveries after close, out-of-order confirms, "
        "returns. Severity is on the Findings table.",
        COUNT, instant(f"sort_desc(sum by (kind) (ackscope_finding_items{SEL}))", "{{kind}}"))


def unacked_by_application():
    return timeseries_panel(
        "Unacked deliveries", "Manual-ack deliveries outstanding now. " + advice.about("unacked_buildup"),
        COUNT, query(f"sum by (application) (ackscope_unacked_deliveries{SEL})", BY_APP))


def oldest_unacked_by_application():
    return timeseries_panel(
        "Oldest unacked delivery", "Age of the oldest delivery still unacked; a steady climb is a stuck "
        "consumer.", SECONDS, query(f"max by (application) (ackscope_oldest_unacked_seconds{SEL})", BY_APP))


def prefetch_and_consumers():
    return timeseries_panel(
        "Consumers and prefetch limit", "Active consumers, and the lowest prefetch limit (basic.qos) in "
        "force on their channels. A prefetch of 0 is unlimited: " + advice.about("unbounded_prefetch")
        + " A prefetch of 1 throttles throughput to one message per round trip.",
        COUNT, query(f"sum by (application) (ackscope_consumers{SEL})", "consumers: " + BY_APP),
        query(f"min by (application) (ackscope_prefetch_limit{SEL})", "prefetch: " + BY_APP, ref="B"))


def ack_latency():
    return timeseries_panel(
        "Ack latency", "Time from a delivery to its ack, nack or reject: p99 (recording rule) and the "
        "median, over 5 minutes. p99 far above the median is a few slow messages, not a slow consumer.",
        SECONDS, query(f"max by (application) (ackscope:deliver_ack_seconds:p99_5m{SEL})", "p99 " + BY_APP),
        query("histogram_quantile(0.5, sum by (application, le) "
              f"(rate(ackscope_deliver_ack_seconds_bucket{SEL}[$__rate_interval])))", "p50 " + BY_APP, ref="B"))


def requeues_and_redeliveries():
    return timeseries_panel(
        "Requeues and redeliveries per second", "Requeued: nacked or rejected with requeue=true. "
        "Redelivered: delivered again with redelivered=true. " + advice.about("requeue_loop"),
        PER_SECOND, query(f"sum by (application) (ackscope:requeues:rate5m{SEL})", "requeued: " + BY_APP),
        query(f"sum by (application) (ackscope:redeliveries:rate5m{SEL})", "redelivered: " + BY_APP, ref="B"))


def bad_acks():
    return timeseries_panel(
        "Acks of unknown delivery tags", "Client acks naming a tag that was not outstanding (double ack, "
        "unknown tag, wrong channel), per interval. " + advice.about("unknown_delivery_tag"),
        COUNT, query(f"sum by (application) (increase(ackscope_unknown_delivery_tags_total{SEL}[$__rate_interval]))",
                     BY_APP))


def unconfirmed_by_application():
    return timeseries_panel(
        "Unconfirmed publishes", "Confirm-mode publishes awaiting their confirm now. Those still "
        "waiting when their channel closes are lost confirms.",
        COUNT, query(f"sum by (application) (ackscope_unconfirmed_publishes{SEL})", BY_APP))


def oldest_unconfirmed_by_application():
    return timeseries_panel(
        "Oldest unconfirmed publish", "Age of the oldest publish awaiting its confirm. Persistent messages "
        "wait for the disk; seconds mean the broker is struggling or blocked.",
        SECONDS, query(f"max by (application) (ackscope_oldest_unconfirmed_seconds{SEL})", BY_APP))


def confirm_latency():
    return timeseries_panel(
        "Confirm latency", "Time from basic.publish to its confirm: p99 (recording rule) and the median, "
        "over 5 minutes.",
        SECONDS, query(f"max by (application) (ackscope:publish_confirm_seconds:p99_5m{SEL})", "p99 " + BY_APP),
        query("histogram_quantile(0.5, sum by (application, le) "
              f"(rate(ackscope_publish_confirm_seconds_bucket{SEL}[$__rate_interval])))", "p50 " + BY_APP, ref="B"))


def confirm_problems():
    return timeseries_panel(
        "Lost, nacked, returned and out-of-order confirms", "Per interval: publishes lost (channel closed "
        "before the confirm), nacked by the broker, returned as unroutable, and confirmed out of order. "
        + advice.about("lost_confirm") + " " + advice.about("confirm_nack"),
        COUNT,
        query(f"sum by (application) (increase(ackscope_lost_confirms_total{SEL}[$__rate_interval]))", "lost: " + BY_APP),
        query(f"sum by (application) (increase(ackscope_confirm_nacks_total{SEL}[$__rate_interval]))",
              "nacked: " + BY_APP, ref="B"),
        query(f"sum by (application) (increase(ackscope_returns_total{SEL}[$__rate_interval]))",
              "returned: " + BY_APP, ref="C"),
        query(f"sum by (application) (increase(ackscope_out_of_order_confirms_total{SEL}[$__rate_interval]))",
              "out of order: " + BY_APP, ref="D"))


def blocked_connections():
    return timeseries_panel(
        "Blocked connections", "Connections the broker holds blocked now (connection.blocked): it stopped "
        "reading from their publishers. " + advice.about("flow_blocked"),
        COUNT, query(f"sum by (application) (ackscope_connection_blocked{SEL})", BY_APP))


def analysed_open_work():
    return bars_panel(
        "Open at the end of the analysed data", "From the latest analysis: deliveries still unacked and "
        "publishes still unconfirmed when the analysed data ends. Open is not lost: they may have been "
        "settled after the data ends; a channel that closed with them open is a finding.",
        COUNT,
        instant(f"sum by (application) (ackscope_analysis_unacked_deliveries{SEL})", "unacked: " + BY_APP),
        instant(f"sum by (application) (ackscope_analysis_unconfirmed_publishes{SEL})", "unconfirmed: " + BY_APP,
                ref="B"),
        colours=thresholds((None, "green"), (1, "orange")), width=8)


def analysed_oldest():
    return bars_panel(
        "Oldest open at the end of the analysed data", "Age of the oldest delivery unacked and of the "
        "oldest publish unconfirmed when the analysed data ends, from the latest analysis. "
        + advice.about("unacked_buildup"),
        SECONDS,
        instant(f"max by (application) (ackscope_analysis_oldest_unacked_seconds{SEL})", "unacked: " + BY_APP),
        instant(f"max by (application) (ackscope_analysis_oldest_unconfirmed_seconds{SEL})",
                "unconfirmed: " + BY_APP, ref="B"),
        colours=thresholds((None, "green"), (60, "orange"), (300, "red")), width=8)


def analysed_latency():
    return bars_panel(
        "Latency p99 over the analysed data", "Publish-to-confirm and deliver-to-ack latency, 99th "
        "percentile over all the data the latest analysis read (its histograms describe the whole run, "
        "so no rate()).",
        SECONDS,
        instant("histogram_quantile(0.99, sum by (application, le) "
                f"(ackscope_analysis_publish_confirm_seconds_bucket{SEL}))", "confirm: " + BY_APP),
        instant("histogram_quantile(0.99, sum by (application, le) "
                f"(ackscope_analysis_deliver_ack_seconds_bucket{SEL}))", "ack: " + BY_APP, ref="B"),
        colours=thresholds((None, "green"), (1, "orange"), (5, "red")), width=8)


def dashboard() -> dict:
    board = new_dashboard(UID, "ackscope / Drill-down",
                          "One vhost or application at a time: findings, consumers, publishers, live and "
                          "as the latest analysis left them.", variables.vhost(), variables.application())
    return assemble(board, [
        ("Findings (latest analysis)", [findings_here(), finding_items()]),
        ("Consumers (live)", [unacked_by_application(), oldest_unacked_by_application(), prefetch_and_consumers(),
                              ack_latency(), requeues_and_redeliveries(), bad_acks()]),
        ("Publishers (live)", [unconfirmed_by_application(), oldest_unconfirmed_by_application(), confirm_latency(),
                               confirm_problems(), blocked_connections()]),
        ("At the end of the analysed data (latest analysis)", [analysed_open_work(), analysed_oldest(),
                                                               analysed_latency()]),
    ])
