"""The overview: is anything wrong, where, and is the picture fresh? Findings come from the scheduled
analysis (pushed), live state from the agents (scraped); the heavy queries are recording rules."""

from __future__ import annotations

from . import advice
from .panels import (COUNT, PER_SECOND, SECONDS, bars_panel, coloured_by_severity, instant, query, stat_panel,
                     thresholds, timeseries_panel, yes_no)
from .layout import assemble, new_dashboard

UID = "ackscope-overview"
BY_WHERE = "{{application}} ({{vhost}})"


def critical_findings():
    return stat_panel(
        "Critical findings", "Findings of severity critical in the latest analysis: data lost "
        "(lost_confirm) or a client that broke the protocol (unknown_delivery_tag). Open the drill-down "
        "to see where; " + advice.EVIDENCE,
        COUNT, instant('sum(ackscope:findings:sum{severity="critical"}) or vector(0)'))


def warning_findings():
    return stat_panel(
        "Warning findings", "Findings of severity warning in the latest analysis: the broker or a "
        "consumer in trouble now (buildup, requeue loops, nacks, redeliveries, flow control).",
        COUNT, instant('sum(ackscope:findings:sum{severity="warning"}) or vector(0)'),
        thresholds((None, "green"), (1, "orange")))


def lost_confirms_live():
    return stat_panel(
        "Lost confirms, last hour (live)", "Publishes the agents saw lost in the last hour: their channel "
        "or connection closed before the broker confirmed them. " + advice.about("lost_confirm"),
        COUNT, instant("sum(ackscope:lost_confirms:increase1h) or vector(0)"))


def lost_publishes_analysed():
    return stat_panel(
        "Lost publishes (latest analysis)", "Publishes the latest analysis found lost, over all the data "
        "it analysed. " + advice.about("lost_confirm"),
        COUNT, instant('sum(ackscope_finding_items{kind="lost_confirm"}) or vector(0)'))


def analysis_freshness():
    return stat_panel(
        "Analysis age", "Time since the scheduled analysis of each lake last finished (one value per "
        "lake it pushed for). The findings on this dashboard are as old as this. Growing past the job's "
        "schedule means the job stopped or fails: look at the job's logs and at 'Last analysis failed'. "
        "No value: no analysis was ever pushed to the Pushgateway this Prometheus scrapes.",
        SECONDS, instant("time() - max by (job, lake) (ackscope_analysis_last_success_timestamp_seconds)",
                         "{{lake}}"),
        thresholds((None, "green"), (2 * 3600, "orange"), (6 * 3600, "red")))


def analysis_failed():
    return yes_no(stat_panel(
        "Last analysis failed", "1 when the last run of the scheduled analysis failed (it pushes this "
        "before exiting), 0 when it succeeded. The findings shown are then those of the last good run; "
        "the job's own output says why it failed.",
        COUNT, instant("max by (job, lake) (ackscope_analysis_failures)", "{{lake}}")), yes="failed", no="no")


def findings_by_kind():
    return coloured_by_severity(bars_panel(
        "Findings by kind and severity", "Findings in the latest analysis, by kind and severity.\n\n"
        + advice.findings_table() + "\n\n" + advice.EVIDENCE,
        COUNT, instant("sort_desc(ackscope:findings:sum)", "{{severity}}: {{kind}}"), width=24))


def unacked_deliveries():
    return timeseries_panel(
        "Unacked deliveries", "Manual-ack deliveries outstanding now on open channels, per application. "
        "A line that only grows is a consumer that stopped acking. " + advice.about("unacked_buildup"),
        COUNT, query("sum by (vhost, application) (ackscope_unacked_deliveries)", BY_WHERE))


def oldest_unacked():
    return timeseries_panel(
        "Oldest unacked delivery", "Age of the oldest delivery still unacked, per application. It "
        "should stay around the time one message takes to process; a steady climb is a stuck handler "
        "(RabbitMQ's consumer timeout closes the channel at 30 minutes by default).",
        SECONDS, query("max by (vhost, application) (ackscope_oldest_unacked_seconds)", BY_WHERE))


def unconfirmed_publishes():
    return timeseries_panel(
        "Unconfirmed publishes", "Confirm-mode publishes awaiting the broker's basic.ack or basic.nack "
        "now. Growth means the broker confirms slower than the publisher sends (disk, flow control); "
        "those still waiting when a channel closes are lost confirms.",
        COUNT, query("sum by (vhost, application) (ackscope_unconfirmed_publishes)", BY_WHERE), width=8)


def oldest_unconfirmed():
    return timeseries_panel(
        "Oldest unconfirmed publish", "Age of the oldest publish awaiting its confirm. Persistent "
        "messages wait for the disk: hundreds of milliseconds under load is normal, seconds is not.",
        SECONDS, query("max by (vhost, application) (ackscope_oldest_unconfirmed_seconds)", BY_WHERE), width=8)


def confirm_latency():
    return timeseries_panel(
        "Confirm latency p99", "99th percentile over 5 minutes of the time from basic.publish to its "
        "confirm. High: the broker is slow to take responsibility (fsync, memory or disk alarms, queue "
        "limits). A publisher that waits for each confirm in turn is limited by this latency.",
        SECONDS, query("ackscope:publish_confirm_seconds:p99_5m", BY_WHERE), width=8)


def ack_latency():
    return timeseries_panel(
        "Ack latency p99", "99th percentile over 5 minutes of the time from a delivery to its ack, nack "
        "or reject: how long consumers take per message, queueing in the prefetch buffer included.",
        SECONDS, query("ackscope:deliver_ack_seconds:p99_5m", BY_WHERE), width=8)


def requeue_rate():
    return timeseries_panel(
        "Requeues per second", "Deliveries nacked or rejected with requeue=true. A steady rate is often "
        "one poison message going round. " + advice.about("requeue_loop"),
        PER_SECOND, query("ackscope:requeues:rate5m", BY_WHERE), width=8)


def redelivery_rate():
    return timeseries_panel(
        "Redeliveries per second", "Deliveries the broker marked redelivered=true: they were delivered "
        "before and not acked (requeued, or their channel closed). " + advice.about("redelivery_after_close"),
        PER_SECOND, query("ackscope:redeliveries:rate5m", BY_WHERE), width=8)


def dashboard() -> dict:
    board = new_dashboard(UID, "ackscope / Overview",
                          "AMQP 0-9-1 traffic seen by ackscope: findings of the latest analysis and the "
                          "agents' live view of unacked deliveries, unconfirmed publishes and latencies.")
    return assemble(board, [
        ("Findings (latest analysis)", [critical_findings(), warning_findings(), lost_confirms_live(),
                                        lost_publishes_analysed(), analysis_freshness(), analysis_failed(),
                                        findings_by_kind()]),
        ("Consumers", [unacked_deliveries(), oldest_unacked(), ack_latency(), requeue_rate(), redelivery_rate()]),
        ("Publishers", [unconfirmed_publishes(), oldest_unconfirmed(), confirm_latency()]),
    ])
