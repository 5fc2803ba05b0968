"""The agent's /metrics: a prometheus-client custom collector that builds fresh metric families at
every scrape (client_python's pattern), so channels that closed since the last scrape disappear.
Every name, type and label set comes from analyzer/metric_names.py; a test checks that."""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ..labels import APPLICATION, VHOST
from ..metric_names import AGENT, BY_NAME, COUNTER, FLUSH_FAILED, GAUGE, HISTOGRAM, METRICS
from .live_state import CONFIRM_LATENCY, ACK_LATENCY, PROBLEM_COUNTERS
from .live_state import Histogram
from .sink import TABLES

# Label values whose counters exist at 0 from the start: increase() cannot count a series' first
# sample, so a flush-failure counter born at 1 would hide the first failure from AmqpAgentFlushFailing.
ALWAYS_COUNTED = {"flushes": ("ok", FLUSH_FAILED), "rows_dropped": tuple(TABLES),
                  "label_folds": (VHOST, APPLICATION), "label_truncations": (VHOST, APPLICATION)}
# ackscope_series_folded_total{metric}: every metric the label caps can fold, likewise.
FOLDABLE = tuple(m.name for m in METRICS if m.source == AGENT and "application" in m.labels)


def family(name: str):
    """An empty family of the catalog's type, help and labels. Counters are named without `_total`
    here: the client library adds it."""
    metric = BY_NAME[name]
    if metric.type == GAUGE:
        return GaugeMetricFamily(name, metric.help, labels=metric.labels)
    if metric.type == COUNTER:
        return CounterMetricFamily(name.removesuffix("_total"), metric.help, labels=metric.labels)
    if metric.type == HISTOGRAM:
        return HistogramMetricFamily(name, metric.help, labels=metric.labels)
    raise ValueError(name)


def _histogram(fam, labels: list[str], histogram: Histogram) -> None:
    fam.add_metric(labels, histogram.cumulative(), histogram.sum)


class AgentCollector(Collector):
    def __init__(self, agent):
        self.agent = agent

    def collect(self):
        agent = self.agent
        state = agent.state
        with state.lock:
            gauges = state.gauges(time.time_ns())
            counters = {name: dict(values) for name, values in state.counters.items()}
            histograms = {name: {k: v for k, v in by.items()} for name, by in state.histograms.items()}
            folded = state.folded_series()
            health = agent.health() | state.label_health()
        for name, values in gauges.items():
            fam = family(name)
            for key, value in sorted(values.items()):
                fam.add_metric(list(key), value)
            yield fam
        for name in PROBLEM_COUNTERS:
            fam = family(name)
            for key, value in sorted(counters[name].items()):
                fam.add_metric(list(key), value)
            yield fam
        for name in (CONFIRM_LATENCY, ACK_LATENCY):
            fam = family(name)
            for key, histogram in sorted(histograms[name].items()):
                _histogram(fam, list(key), histogram)
            yield fam
        fam = family("ackscope_series_folded_total")
        for metric, n in sorted(({name: 0 for name in FOLDABLE} | folded).items()):
            fam.add_metric([metric], n)
        yield fam
        yield from self._health(health)

    def _health(self, h: dict):
        for name, key in (("ackscope_agent_packets_total", "packets"), ("ackscope_agent_bytes_total", "bytes"),
                          ("ackscope_agent_kernel_drops_total", "kernel_drops"),
                          ("ackscope_agent_decode_errors_total", "errors"),
                          ("ackscope_agent_capture_gaps_total", "gaps"),
                          ("ackscope_agent_tls_connections_total", "tls_connections"),
                          ("ackscope_agent_tls_not_decrypted_total", "tls_not_decrypted"),
                          ("ackscope_agent_buffered_rows", "buffered_rows")):
            fam = family(name)
            fam.add_metric([], h[key])
            yield fam
        for name, key in (("ackscope_agent_frames_total", "frames_by_method"),
                          ("ackscope_agent_unsupported_flows_total", "unsupported"),
                          ("ackscope_agent_flushes_total", "flushes"),
                          ("ackscope_agent_rows_dropped_total", "rows_dropped"),
                          ("ackscope_agent_label_folds_total", "label_folds"),
                          ("ackscope_agent_label_truncations_total", "label_truncations")):
            fam = family(name)
            values = {label: 0 for label in ALWAYS_COUNTED.get(key, ())} | h[key]
            for label, n in sorted(values.items()):
                fam.add_metric([label], n)
            yield fam
        buckets, total = h["flush_histogram"]
        fam = family("ackscope_agent_flush_duration_seconds")
        fam.add_metric([], buckets, total)
        yield fam
        if h["last_flush_ts"] is not None:
            fam = family("ackscope_agent_last_flush_timestamp_seconds")
            fam.add_metric([], h["last_flush_ts"])
            yield fam
