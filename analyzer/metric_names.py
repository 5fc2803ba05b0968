"""Every metric ackscope exposes: the one list the agent, `ackscope push`, the alert rules and the
dashboards are checked against. Names are an interface (README, "Metrics"): renaming one breaks
somebody's alerts, so a test fails when a rule or panel uses a name that is not here.

Two sources, two ways to Prometheus (DESIGN.md, "Metrics, labels and alerts"):
- `agent`: live state of the capture agent, scraped from its /metrics. Counters count since the
  agent started; gauges describe the channels open now.
- `analysis`: the scheduled analysis, pushed to a Pushgateway with PUT per job and lake, so the
  group always describes the lake's latest analysis and what is solved disappears. They are gauges
  of that analysis (no `_total`): a push replaces them, nothing accumulates.

Labels are bounded (labels.py): never a connection id, port, channel, delivery tag or message id.
"""

from __future__ import annotations

from dataclasses import dataclass

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"
AGENT, ANALYSIS = "agent", "analysis"
# The Pushgateway `job` the analysis pushes its results under unless told otherwise (--push-job, --job).
DEFAULT_PUSH_JOB = "ackscope-analysis"
WHERE = ("vhost", "application")          # every per-traffic series carries these
FINDING = ("kind", "severity") + WHERE


@dataclass(frozen=True)
class Metric:
    name: str       # as exposed; for counters the `_total` is part of it, for histograms the base name
    type: str       # gauge, counter or histogram
    source: str     # agent (scraped) or analysis (pushed)
    labels: tuple   # label names, besides job/instance
    help: str


METRICS = (
    # -- live channel state (agent) ---------------------------------------------------------------
    Metric("ackscope_unacked_deliveries", GAUGE, AGENT, WHERE + ("role",),
           "Manual-ack deliveries outstanding now on open channels."),
    Metric("ackscope_oldest_unacked_seconds", GAUGE, AGENT, WHERE,
           "Age of the oldest manual-ack delivery outstanding now (max over channels)."),
    Metric("ackscope_unconfirmed_publishes", GAUGE, AGENT, WHERE,
           "Confirm-mode publishes awaiting their basic.ack/nack now."),
    Metric("ackscope_oldest_unconfirmed_seconds", GAUGE, AGENT, WHERE,
           "Age of the oldest publish awaiting its confirm now (max over channels)."),
    Metric("ackscope_prefetch_limit", GAUGE, AGENT, WHERE,
           "Lowest prefetch limit (basic.qos) in force on channels with consumers; 0 means unlimited."),
    Metric("ackscope_consumers", GAUGE, AGENT, WHERE, "Consumers (basic.consume-ok) active now."),
    Metric("ackscope_connection_blocked", GAUGE, AGENT, WHERE,
           "Connections the broker holds blocked now (connection.blocked without unblocked)."),
    Metric("ackscope_lost_confirms_total", COUNTER, AGENT, WHERE,
           "Publishes whose channel or connection closed before their confirm."),
    Metric("ackscope_confirm_nacks_total", COUNTER, AGENT, WHERE, "Publishes the broker nacked."),
    Metric("ackscope_unknown_delivery_tags_total", COUNTER, AGENT, WHERE,
           "Client acks naming a tag not outstanding (double ack, unknown tag, wrong channel)."),
    Metric("ackscope_requeues_total", COUNTER, AGENT, WHERE,
           "Deliveries nacked or rejected with requeue=true."),
    Metric("ackscope_redeliveries_total", COUNTER, AGENT, WHERE, "Deliveries with redelivered=true."),
    Metric("ackscope_out_of_order_confirms_total", COUNTER, AGENT, WHERE,
           "Single confirms that arrived while an earlier publish was unconfirmed."),
    Metric("ackscope_returns_total", COUNTER, AGENT, WHERE, "Mandatory publishes the broker returned."),
    Metric("ackscope_publish_confirm_seconds", HISTOGRAM, AGENT, WHERE,
           "Time from basic.publish to its confirm."),
    Metric("ackscope_deliver_ack_seconds", HISTOGRAM, AGENT, WHERE,
           "Time from a manual-ack delivery to its ack, nack or reject."),
    Metric("ackscope_series_folded_total", COUNTER, AGENT, ("metric",),
           "Series folded into vhost or application other by the label caps."),
    # -- the agent's own health ---------------------------------------------------------------------
    Metric("ackscope_agent_packets_total", COUNTER, AGENT, (), "Packets captured (loopback counted once)."),
    Metric("ackscope_agent_bytes_total", COUNTER, AGENT, (), "Bytes of the packets captured."),
    Metric("ackscope_agent_frames_total", COUNTER, AGENT, ("method",), "AMQP frames decoded, by method."),
    Metric("ackscope_agent_kernel_drops_total", COUNTER, AGENT, (),
           "Packets the kernel dropped before the agent read them (PACKET_STATISTICS)."),
    Metric("ackscope_agent_decode_errors_total", COUNTER, AGENT, (), "Malformed frames and framing errors."),
    Metric("ackscope_agent_capture_gaps_total", COUNTER, AGENT, (), "Capture gaps (bytes never seen) in flows."),
    Metric("ackscope_agent_tls_connections_total", COUNTER, AGENT, (), "TLS (amqps) connections seen."),
    Metric("ackscope_agent_tls_not_decrypted_total", COUNTER, AGENT, (),
           "TLS connections not decrypted: no key in the key log for them, or it came past the hold bound."),
    Metric("ackscope_agent_unsupported_flows_total", COUNTER, AGENT, ("protocol",),
           "Flows on a broker port speaking something else (AMQP 1.0, the stream protocol, ...)."),
    Metric("ackscope_agent_buffered_rows", GAUGE, AGENT, (), "Rows decoded and not yet committed."),
    Metric("ackscope_agent_flushes_total", COUNTER, AGENT, ("outcome",), "Flushes to the lake, by outcome."),
    Metric("ackscope_agent_flush_duration_seconds", HISTOGRAM, AGENT, (), "Time one flush took."),
    Metric("ackscope_agent_last_flush_timestamp_seconds", GAUGE, AGENT, (),
           "Unix time of the last successful flush."),
    Metric("ackscope_agent_rows_dropped_total", COUNTER, AGENT, ("table",),
           "Rows dropped because the sink failed and the buffer was full."),
    Metric("ackscope_agent_label_folds_total", COUNTER, AGENT, ("label",),
           "Label values the cap of their label (vhost, application) answered with other."),
    Metric("ackscope_agent_label_truncations_total", COUNTER, AGENT, ("label",),
           "Label values cut to the length bound (they end with a marker of how much was cut), by label."),
    # The agent process itself: client_python's standard process collector, under its standard names
    # (every exporter has them, and Prometheus users know them), so no ackscope_ prefix.
    Metric("process_resident_memory_bytes", GAUGE, AGENT, (), "Resident memory of the agent process."),
    Metric("process_virtual_memory_bytes", GAUGE, AGENT, (), "Virtual memory of the agent process."),
    Metric("process_cpu_seconds_total", COUNTER, AGENT, (), "CPU time the agent process used, user and system."),
    Metric("process_start_time_seconds", GAUGE, AGENT, (), "Unix time the agent process started."),
    Metric("process_open_fds", GAUGE, AGENT, (), "File descriptors the agent process has open."),
    Metric("process_max_fds", GAUGE, AGENT, (), "The agent process's limit on open file descriptors."),
    # -- the analysis (pushed) -------------------------------------------------------------------------
    Metric("ackscope_findings", GAUGE, ANALYSIS, FINDING, "Findings in the latest analysis."),
    Metric("ackscope_finding_items", GAUGE, ANALYSIS, FINDING,
           "What the findings count (lost publishes, nacked publishes, bad acks, requeued deliveries, "
           "redeliveries after close, out-of-order confirms, returns, ...), summed by kind."),
    Metric("ackscope_analysis_unacked_deliveries", GAUGE, ANALYSIS, WHERE,
           "Manual-ack deliveries unacked at the end of the analysed data."),
    Metric("ackscope_analysis_oldest_unacked_seconds", GAUGE, ANALYSIS, WHERE,
           "Age of the oldest delivery unacked at the end of the analysed data."),
    Metric("ackscope_analysis_unconfirmed_publishes", GAUGE, ANALYSIS, WHERE,
           "Publishes unconfirmed at the end of the analysed data."),
    Metric("ackscope_analysis_oldest_unconfirmed_seconds", GAUGE, ANALYSIS, WHERE,
           "Age of the oldest publish unconfirmed at the end of the analysed data."),
    Metric("ackscope_analysis_publish_confirm_seconds", HISTOGRAM, ANALYSIS, WHERE,
           "Publish-to-confirm latency over the analysed data."),
    Metric("ackscope_analysis_deliver_ack_seconds", HISTOGRAM, ANALYSIS, WHERE,
           "Deliver-to-ack latency over the analysed data."),
    Metric("ackscope_analysis_last_success_timestamp_seconds", GAUGE, ANALYSIS, (),
           "Unix time the last analysis of this lake finished."),
    Metric("ackscope_analysis_duration_seconds", GAUGE, ANALYSIS, (), "How long the last analysis took."),
    Metric("ackscope_analysis_frames", GAUGE, ANALYSIS, (), "Frame rows the last analysis read."),
    Metric("ackscope_analysis_failures", GAUGE, ANALYSIS, (),
           "1 when the last analysis of this lake failed (pushed by the failing run), else 0."),
)

BY_NAME = {m.name: m for m in METRICS}
STANDARD_PROCESS = frozenset(m.name for m in METRICS if m.name.startswith("process_"))


def exposed_names(metric: Metric) -> tuple[str, ...]:
    """The series names Prometheus stores for it (a histogram's _bucket, _sum and _count)."""
    if metric.type == HISTOGRAM:
        return tuple(metric.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return (metric.name,)


EXPOSED = {series: m for m in METRICS for series in exposed_names(m)}

# Bucket bounds (seconds) of every latency histogram, agent and analysis alike, so a panel can put
# them side by side: publisher confirms take milliseconds (hundreds for persistent messages under
# load); a consumer may hold a delivery up to RabbitMQ's consumer_timeout (30 minutes).
LATENCY_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                           30.0, 60.0, 300.0, 1800.0)
# ackscope_agent_flushes_total{outcome}: the value of a flush that did not reach the lake.
FLUSH_FAILED = "error"
