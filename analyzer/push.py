"""`ackscope push`: the lake's latest analysis as metrics, PUT to a Prometheus Pushgateway.

Batch results are pushed, not scraped (DESIGN.md, "Metrics, labels and alerts"): one group per job
and lake, replaced whole by every push (HTTP PUT), so a finding that is gone from the table is gone
from Prometheus too. Every family is built fresh from the tables (delta-rs, no Spark) on each push,
like a custom collector of client_python: nothing carries over from an earlier push.

What is pushed is exactly the `analysis` metrics of metric_names.py, labelled by vhost and
application (labels.py, the caps built per push over the sorted values of the connections that
opened a channel, which only a connection the broker accepted does, so the same lake always gives
the same labels and refused connections take no slot). A failed analysis pushes only ackscope_analysis_failures=1, with POST, so
the findings of the last good analysis stay beside it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import push_to_gateway, pushadd_to_gateway

from . import labels, lake, metric_names, schema
from .published import read_published
from .timeline.tables import CHANNELS

DEFAULT_JOB = metric_names.DEFAULT_PUSH_JOB
NS = 1e9
# A delivery or publish counts in a latency histogram only when settled by the peer: a close, a
# capture gap or the end of the data is no measure of how fast the peer answers.
CONFIRMED = ("acked", "nacked")
SETTLED_BY_CONSUMER = ("ack", "nack", "reject")


class PushError(Exception):
    """The Pushgateway could not be reached or refused the push: the message says which and why."""


@dataclass
class Where:
    """Per-connection label values, from the connections table (vhost, application)."""
    by_connection: dict = field(default_factory=dict)   # connection_id -> (vhost, application) before the caps
    caps: labels.SeriesCaps = field(default_factory=labels.SeriesCaps)

    def of(self, connection_id: str | None, metric: str, fallback_name: str | None = None) -> tuple[str, str]:
        where = self.by_connection.get(connection_id, (labels.UNKNOWN, labels.application(fallback_name, None, None)))
        return self.caps.where(where, metric)


def lake_label(lake_dir: str) -> str:
    """The lake's grouping-key value: one group per lake however the path was spelt."""
    return lake_dir if "://" in lake_dir else os.path.abspath(lake_dir)


def read_where(lake_dir: str, max_applications: int, max_vhosts: int) -> Where:
    table = lake.read_table(lake_dir, "connections", schema.CONNECTIONS,
                            columns=["connection_id", "vhost", "connection_name", "client_product", "client_addr"])
    where = Where(caps=labels.SeriesCaps(max_applications, max_vhosts))
    if table is None:
        return where
    for row in table.to_pylist():
        where.by_connection[row["connection_id"]] = (
            labels.vhost(row["vhost"]),
            labels.application(row["connection_name"], row["client_product"], row["client_addr"]))
    # Admit values in sorted order: which ones a cap keeps must not depend on file order. Only the
    # connections with a channel or a finding take a slot here (a connection the broker refused has
    # neither); any other gets one only if it has something pushed and room is left.
    accepted = set()
    for name, table_schema in (("channels", CHANNELS), ("findings", schema.FINDINGS)):
        table = read_published(lake_dir, name, table_schema, columns=["connection_id"])
        if table is not None:
            accepted.update(pc.unique(table["connection_id"]).to_pylist())
    admitted = [where.by_connection[c] for c in accepted if c in where.by_connection]
    for cap, values in ((where.caps.vhost, {v for v, _ in admitted}),
                        (where.caps.application, {a for _, a in admitted})):
        for value in sorted(values):
            cap.label(value)
        cap.folds = 0
    return where


@dataclass
class Pushed:
    families: list              # what was pushed
    folded: dict                # metric -> series folded into application="other" by the cap

    @property
    def samples(self) -> int:
        return sum(len(f.samples) for f in self.families)


def analysis_families(lake_dir: str, max_applications: int = labels.DEFAULT_MAX_APPLICATIONS,
                      max_vhosts: int = labels.DEFAULT_MAX_VHOSTS) -> Pushed:
    """Every analysis metric family of this lake, as the tables hold it now."""
    where = read_where(lake_dir, max_applications, max_vhosts)
    families = [*_findings_families(lake_dir, where), *_end_state_families(lake_dir, where),
                _latency_family(lake_dir, where, "publishes", schema.PUBLISHES,
                                "ackscope_analysis_publish_confirm_seconds",
                                pc.field("outcome").isin(list(CONFIRMED))),
                _latency_family(lake_dir, where, "deliveries", schema.DELIVERIES,
                                "ackscope_analysis_deliver_ack_seconds",
                                pc.field("outcome").isin(list(SETTLED_BY_CONSUMER)) & (pc.field("no_ack") == False)),  # noqa: E712
                *_run_families(lake_dir), _gauge("ackscope_analysis_failures", 0)]
    pushed = {f.name for f in families}
    expected = {m.name for m in metric_names.METRICS if m.source == metric_names.ANALYSIS}
    assert pushed == expected, f"push and metric_names disagree: {sorted(pushed ^ expected)}"
    return Pushed(families, {name: n for name, n in where.caps.folded.items() if n})


def _family(name: str):
    metric = metric_names.BY_NAME[name]
    make = HistogramMetricFamily if metric.type == metric_names.HISTOGRAM else GaugeMetricFamily
    return make(name, metric.help, labels=list(metric.labels))


def _gauge(name: str, value: float | None):
    family = _family(name)
    if value is not None:
        family.add_metric([], value)
    return family


def _findings_families(lake_dir: str, where: Where) -> list:
    findings, items = _family("ackscope_findings"), _family("ackscope_finding_items")
    table = read_published(lake_dir, "findings", schema.FINDINGS,
                            columns=["kind", "severity", "connection_id", "connection_name", "count"])
    counted, summed = defaultdict(int), defaultdict(int)
    for row in (table.to_pylist() if table is not None else []):
        key = (row["kind"], row["severity"], *where.of(row["connection_id"], "ackscope_findings", row["connection_name"]))
        counted[key] += 1
        summed[key] += row["count"] or 0
    for key in sorted(counted):
        findings.add_metric(list(key), counted[key])
        items.add_metric(list(key), summed[key])
    return [findings, items]


def _where_index(where: Where, connection_ids: pa.ChunkedArray, metric: str) -> tuple[list, np.ndarray]:
    """The label pairs of the rows' connections, and for every row the index of its pair: the
    connections are few, the rows many, so the lookup runs once per connection."""
    encoded = pc.dictionary_encode(connection_ids.combine_chunks())
    keys, index_of_key, connection_to_key = [], {}, []
    for connection_id in encoded.dictionary.to_pylist():
        key = where.of(connection_id, metric)
        if key not in index_of_key:
            index_of_key[key] = len(keys)
            keys.append(key)
        connection_to_key.append(index_of_key[key])
    rows = encoded.indices.to_numpy(zero_copy_only=False)
    return keys, np.asarray(connection_to_key, dtype=np.int64)[rows] if len(rows) else np.zeros(0, np.int64)


def _end_state_families(lake_dir: str, where: Where) -> list:
    """Unacked and unconfirmed at the end of the data: each channel incarnation's last bucket,
    summed per application (counts) or the largest (ages)."""
    names = ("ackscope_analysis_unacked_deliveries", "ackscope_analysis_oldest_unacked_seconds",
             "ackscope_analysis_unconfirmed_publishes", "ackscope_analysis_oldest_unconfirmed_seconds")
    families = [_family(name) for name in names]
    incarnation = ["connection_id", "channel", "incarnation"]
    table = read_published(lake_dir, "channel_metrics", schema.CHANNEL_METRICS,
                            columns=[*incarnation, "bucket_start_ns", "unacked", "oldest_unacked_age_ns",
                                     "unconfirmed", "oldest_unconfirmed_age_ns"])
    if table is None or table.num_rows == 0:
        return families
    last = table.group_by(incarnation).aggregate([("bucket_start_ns", "max")]).rename_columns(
        [*incarnation, "bucket_start_ns"])
    ends = last.join(table, [*incarnation, "bucket_start_ns"], join_type="inner")
    keys, rows = _where_index(where, ends["connection_id"], names[0])
    columns = [ends[c].fill_null(0).to_numpy() for c in ("unacked", "oldest_unacked_age_ns", "unconfirmed",
                                                        "oldest_unconfirmed_age_ns")]
    totals = [np.bincount(rows, columns[0], len(keys)), np.zeros(len(keys)),
              np.bincount(rows, columns[2], len(keys)), np.zeros(len(keys))]
    np.maximum.at(totals[1], rows, columns[1] / NS)
    np.maximum.at(totals[3], rows, columns[3] / NS)
    for i in sorted(range(len(keys)), key=keys.__getitem__):
        for family, values in zip(families, totals):
            family.add_metric(list(keys[i]), float(values[i]))
    return families


def _latency_family(lake_dir: str, where: Where, table_name: str, table_schema: pa.Schema, name: str,
                    settled: pc.Expression):
    family = _family(name)
    table = read_published(lake_dir, table_name, table_schema,
                            columns=["connection_id", "outcome", "no_ack", "settle_latency_ns"])
    if table is None:
        return family
    table = table.filter(settled & pc.field("settle_latency_ns").is_valid())
    if table.num_rows == 0:
        return family
    keys, rows = _where_index(where, table["connection_id"], name)
    seconds = table["settle_latency_ns"].to_numpy() / NS
    bounds = np.array(metric_names.LATENCY_BUCKETS_SECONDS)
    # le semantics: a value equal to a bound is in that bound's bucket; past the last, only +Inf.
    bucket = np.searchsorted(bounds, seconds, side="left")
    per_bucket = np.bincount(rows * (len(bounds) + 1) + bucket, minlength=len(keys) * (len(bounds) + 1))
    cumulative = np.cumsum(per_bucket.reshape(len(keys), len(bounds) + 1), axis=1)
    sums = np.bincount(rows, seconds, len(keys))
    for i in sorted(range(len(keys)), key=keys.__getitem__):
        buckets = [(_le(b), int(c)) for b, c in zip(bounds, cumulative[i][:-1])] + [("+Inf", int(cumulative[i][-1]))]
        family.add_metric(list(keys[i]), buckets, float(sums[i]))
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def _run_families(lake_dir: str) -> list:
    """The last analysis run's own figures; absent (no sample) before any run."""
    runs = lake.read_table(lake_dir, "analysis_runs", schema.ANALYSIS_RUNS,
                           columns=["started_ts", "finished_ts", "frames"])
    last = max(runs.to_pylist(), key=lambda r: r["finished_ts"]) if runs is not None and runs.num_rows else None
    return [
        _gauge("ackscope_analysis_last_success_timestamp_seconds", last and last["finished_ts"].timestamp()),
        _gauge("ackscope_analysis_duration_seconds",
               last and (last["finished_ts"] - last["started_ts"]).total_seconds()),
        _gauge("ackscope_analysis_frames", last and last["frames"]),
    ]


class _Families:
    """A collector handing out families already built (the registry asks twice: describe, collect)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return iter(self.families)


def _registry(families: list) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


def push(lake_dir: str, gateway: str, job: str = DEFAULT_JOB, timeout: float = 10.0,
         max_applications: int = labels.DEFAULT_MAX_APPLICATIONS) -> Pushed:
    """PUT the lake's analysis metrics as the group {job, lake}; returns what was pushed."""
    pushed = analysis_families(lake_dir, max_applications)
    _send(push_to_gateway, gateway, job, lake_dir, pushed.families, timeout)
    return pushed


def push_failure(lake_dir: str, gateway: str, job: str = DEFAULT_JOB, timeout: float = 10.0) -> None:
    """ackscope_analysis_failures=1 for the group, keeping what the last good analysis pushed (POST)."""
    _send(pushadd_to_gateway, gateway, job, lake_dir, [_gauge("ackscope_analysis_failures", 1)], timeout)


def _send(method, gateway: str, job: str, lake_dir: str, families: list, timeout: float) -> None:
    try:
        method(gateway, job=job, registry=_registry(families), grouping_key={"lake": lake_label(lake_dir)},
               timeout=timeout)
    except OSError as exc:  # URLError and HTTPError are OSErrors: unreachable, refused, 4xx/5xx
        raise PushError(f"could not push to the Pushgateway at {gateway}: {exc}") from exc
