"""The capture agents' own health: is each one seeing the traffic, decoding it, and getting it into the
lake? A finding is only as good as the capture under it: drops and gaps here mean missing evidence."""

from __future__ import annotations

from . import variables
from .layout import assemble, new_dashboard
from .panels import (BYTES, BYTES_PER_SECOND, COUNT, PACKETS_PER_SECOND, PER_SECOND, SECONDS, query,
                     timeseries_panel)
from .promql import AGENT

UID = "ackscope-agent"
SEL = "{" + AGENT + "}"
BY_AGENT = "{{instance}}"


def packets():
    return timeseries_panel(
        "Packets captured", "Packets per second each agent captured (loopback counted once). Zero while "
        "the broker has traffic: the agent is on the wrong interface or port.",
        PACKETS_PER_SECOND, query(f"sum by (instance) (rate(ackscope_agent_packets_total{SEL}[$__rate_interval]))",
                                  BY_AGENT), width=8)


def captured_bytes():
    return timeseries_panel(
        "Bytes captured", "Bytes per second of the packets each agent captured.",
        BYTES_PER_SECOND, query(f"sum by (instance) (rate(ackscope_agent_bytes_total{SEL}[$__rate_interval]))",
                                BY_AGENT), width=8)


def kernel_drops():
    return timeseries_panel(
        "Kernel drops", "Packets per second the kernel dropped before the agent read them. Any drop can "
        "hide a frame, and the analysis then marks what it cannot know as unknown. Give the agent more "
        "CPU, a bigger socket buffer, or capture fewer ports.",
        PACKETS_PER_SECOND,
        query(f"sum by (instance) (rate(ackscope_agent_kernel_drops_total{SEL}[$__rate_interval]))", BY_AGENT),
        width=8)


def decode_problems():
    return timeseries_panel(
        "Decode errors, capture gaps, unsupported flows", "Per interval: malformed frames and framing "
        "errors, bytes of a flow the capture never showed (gaps), and flows on a broker port speaking "
        "another protocol (AMQP 1.0, TLS, ...; by protocol). Gaps follow drops; decode errors without "
        "drops are worth a bug report with the capture.",
        COUNT,
        query(f"sum by (instance) (increase(ackscope_agent_decode_errors_total{SEL}[$__rate_interval]))",
              "decode errors: " + BY_AGENT),
        query(f"sum by (instance) (increase(ackscope_agent_capture_gaps_total{SEL}[$__rate_interval]))",
              "gaps: " + BY_AGENT, ref="B"),
        query(f"sum by (instance, protocol) (increase(ackscope_agent_unsupported_flows_total{SEL}[$__rate_interval]))",
              "unsupported {{protocol}}: " + BY_AGENT, ref="C"))


def frames_by_method():
    return timeseries_panel(
        "Frames by method", "AMQP frames decoded per second, by method, over all agents shown: the "
        "traffic's shape (publishes against confirms, deliveries against acks).",
        PER_SECOND, query(f"sum by (method) (rate(ackscope_agent_frames_total{SEL}[$__rate_interval]))", "{{method}}"))


def buffered_rows():
    return timeseries_panel(
        "Buffered rows", "Rows decoded and not yet committed to the lake. Growing without falling back "
        "after flushes: the lake is slower than the traffic, or flushes fail.",
        COUNT, query(f"sum by (instance) (ackscope_agent_buffered_rows{SEL})", BY_AGENT), width=8)


def flush_lag():
    return timeseries_panel(
        "Time since last flush", "Time since each agent last committed to the lake: what a crash now "
        "would lose, and how stale the lake is for the next analysis. It should stay under the flush "
        "interval; if it climbs, see 'Flushes' and the agent's log.",
        SECONDS, query(f"time() - max by (instance) (ackscope_agent_last_flush_timestamp_seconds{SEL})", BY_AGENT),
        width=8)


def flush_duration():
    return timeseries_panel(
        "Flush duration p99", "99th percentile of the time one flush to the lake took. Long flushes "
        "(object storage, a big backlog) make buffered rows grow.",
        SECONDS, query("histogram_quantile(0.99, sum by (instance, le) "
                       f"(rate(ackscope_agent_flush_duration_seconds_bucket{SEL}[$__rate_interval])))", BY_AGENT),
        width=8)


def flushes_by_outcome():
    return timeseries_panel(
        "Flushes", "Flushes to the lake per second, by outcome. Failures are retried while the buffer "
        "lasts; 'Rows dropped' counts what was lost once it was full.",
        PER_SECOND, query(f"sum by (instance, outcome) (rate(ackscope_agent_flushes_total{SEL}[$__rate_interval]))",
                          "{{outcome}}: " + BY_AGENT))


def rows_dropped():
    return timeseries_panel(
        "Rows dropped", "Rows dropped per interval, by table, because the lake could not be written and "
        "the buffer was full. Those frames are missing from the lake for good: fix the lake's storage.",
        COUNT, query(f"sum by (instance, table) (increase(ackscope_agent_rows_dropped_total{SEL}[$__rate_interval]))",
                     "{{table}}: " + BY_AGENT))


def series_folded():
    return timeseries_panel(
        "Series folded into \"other\"", "Series the label caps folded into vhost=\"other\" or "
        "application=\"other\", per interval and metric: more distinct vhosts, or applications "
        "(connection_name, else client product and host), than the caps allow (--max-vhosts, "
        "--max-applications; only connections the broker accepted take a value). Give clients stable "
        "connection names, or raise the caps if Prometheus can take it.",
        COUNT, query(f"sum by (metric) (increase(ackscope_series_folded_total{SEL}[$__rate_interval]))", "{{metric}}"))


def memory():
    return timeseries_panel(
        "Memory (RSS)", "Resident memory of each agent process. It follows what is open (connections, "
        "unacked deliveries, unconfirmed publishes) and the rows buffered for the lake; give the container "
        "a limit above its peak (docs/agent.md has the measured figures).",
        BYTES, query(f"max by (instance) (process_resident_memory_bytes{SEL})", BY_AGENT), width=12)


def cpu():
    return timeseries_panel(
        "CPU (cores)", "Cores each agent process uses. Near a whole core the capture cannot keep up: "
        "kernel drops follow.",
        COUNT, query(f"sum by (instance) (rate(process_cpu_seconds_total{SEL}[$__rate_interval]))", BY_AGENT),
        width=12)


def dashboard() -> dict:
    board = new_dashboard(UID, "ackscope / Agent health",
                          "The capture agents: what they see, what they lose, and how far behind the lake is.",
                          variables.agent_instance())
    return assemble(board, [
        ("Capture", [packets(), captured_bytes(), kernel_drops(), decode_problems(), frames_by_method()]),
        ("Lake", [buffered_rows(), flush_lag(), flush_duration(), flushes_by_outcome(), rows_dropped()]),
        ("Process", [memory(), cpu()]),
        ("Labels", [series_folded()]),
    ])
