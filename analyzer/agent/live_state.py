"""The reference state machine run live: decoded rows in, counters and histograms of the records it
emits, and the open state (timeline/live.py) read at each scrape.

Everything carries bounded labels only (labels.py): vhost and application, from the connection's
own facts (connection.start-ok's connection_name or product, the client address, connection.open's
vhost). Callers hold `lock` around `feed` and around reading for a scrape: the decode loop and the
HTTP server run on different threads.

An application's problem counters exist at 0 from its connection.open-ok on (`_admit`):
Prometheus' increase() and rate() cannot count a series' first sample, so a counter born at 30 lost
confirms would never raise the counter-based alerts (they also catch a series born non-zero, for a
connection that opens and loses between two scrapes: dashboards/rules.py). Admission to the label
caps happens there too, in the order of the connection.open-ok frames, so which vhosts and
applications keep their own label is decided by the traffic, never by when a tick or scrape ran;
and only connections the broker accepted take a slot: a flood of connection.opens the broker refuses
(a made-up vhost, bad credentials) makes no series and leaves the caps to the real clients.
"""

from __future__ import annotations

import threading
from collections import Counter

from .. import labels
from ..metric_names import LATENCY_BUCKETS_SECONDS
from ..timeline import Timelines
from ..timeline import records as r
from ..timeline.live import open_connections

# Counters fed by the records the machine emits: metric -> predicate on a record.
PUBLISH_COUNTERS = {
    "ackscope_lost_confirms_total": lambda p: p.outcome == r.LOST and p.mode == r.CONFIRM,
    "ackscope_confirm_nacks_total": lambda p: p.outcome == r.NACKED,
    "ackscope_out_of_order_confirms_total": lambda p: bool(p.out_of_order),
    "ackscope_returns_total": lambda p: p.return_code is not None,
}
DELIVERY_COUNTERS = {
    "ackscope_requeues_total": lambda d: d.outcome in (r.NACK, r.REJECT) and d.requeue is True,
    "ackscope_redeliveries_total": lambda d: d.redelivered is True,
}
VIOLATION_COUNTER = "ackscope_unknown_delivery_tags_total"
PROBLEM_COUNTERS = (*PUBLISH_COUNTERS, *DELIVERY_COUNTERS, VIOLATION_COUNTER)
CONFIRM_LATENCY, ACK_LATENCY = "ackscope_publish_confirm_seconds", "ackscope_deliver_ack_seconds"
# The catalog's buckets, shared with the analysis's histograms so panels can put them side by side.
CONFIRM_BUCKETS = ACK_BUCKETS = LATENCY_BUCKETS_SECONDS
SETTLED = frozenset((r.ACK, r.NACK, r.REJECT))
CONNECTION_OPEN, CONNECTION_OPEN_OK = "connection.open", "connection.open-ok"
MAX_LABEL_CACHE = 100_000


class Histogram:
    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append((repr(bound), running))
        out.append(("+Inf", self.count))
        return out


class LiveState:
    def __init__(self, caps: labels.SeriesCaps):
        self.caps = caps
        self.lock = threading.Lock()
        self.timelines = Timelines()
        self.facts: dict[str, dict] = {}      # connection id -> its decoder facts (a live dict)
        self.counters: dict[str, Counter] = {name: Counter() for name in PROBLEM_COUNTERS}
        self.histograms: dict[str, dict] = {CONFIRM_LATENCY: {}, ACK_LATENCY: {}}
        self.timeline_errors = 0
        # Each series' labels after the caps, and the metrics it has been asked for (a bit each,
        # _metric_bits): the caps count a series' fold once per metric. One entry per series, not per
        # (series, metric) pair: under churn every short connection may name a new application, and
        # a pair each (a key tuple, a value tuple, a dict slot) made this cache ~1.7 KB a series, the
        # agent's largest growth in the soak (~0.6 MB a minute, ~22 MB when it was cleared).
        self._labels: dict[tuple[str, str], tuple[tuple[str, str], int]] = {}
        self._label_pairs = 0  # (series, metric) pairs in _labels: it is cleared past MAX_LABEL_CACHE
        self._metric_bits: dict[str, int] = {}
        self.opening: set[str] = set()  # connections with a connection.open the broker has not accepted yet

    # -- rows in -------------------------------------------------------------------------------

    def feed(self, rows: list[dict], ended_ids: list[str], facts: dict[str, dict]) -> None:
        self.facts.update(facts)
        self._admit(rows)
        feed, records = self.timelines.feed, []
        for row in rows:
            try:
                records += feed(row)
            except Exception:  # the machine refused a row (a decoder bug): lose that connection only
                self.timeline_errors += 1
                records += self.timelines.end_connection(row["connection_id"])
        for connection_id in ended_ids:
            records += self.timelines.end_connection(connection_id)
        for record in records:
            self._count(record)
        for connection_id in ended_ids:
            self.facts.pop(connection_id, None)
            self.opening.discard(connection_id)

    def _admit(self, rows: list[dict]) -> None:
        """Zero the problem counters of the connections the broker accepted in these rows, in the
        order of their connection.open-ok frames (capture time; the rows come sorted by connection id,
        whose order says nothing). The caps admit their labels in that order, before any record or
        gauge of this batch can ask for one. A connection.open not yet answered marks its connection
        as opening: it gets labels already admitted or "other", never a slot. A connection whose
        opening was not captured (mid-stream) gets its labels at its first record, as it has no
        vhost or application name to admit anyway."""
        opens = sorted((row["ts_ns"], row["method"] == CONNECTION_OPEN_OK, row["connection_id"]) for row in rows
                       if row["method"] in (CONNECTION_OPEN, CONNECTION_OPEN_OK))
        for _, accepted, connection_id in opens:
            if not accepted:
                self.opening.add(connection_id)
                continue
            self.opening.discard(connection_id)
            for name in PROBLEM_COUNTERS:
                self.counters[name][self._folded(connection_id, name)] += 0

    def end_of_data(self) -> None:
        for record in self.timelines.end_of_data():
            self._count(record)

    def _count(self, record) -> None:
        kind = type(record)
        if kind is r.Publish:
            connection_id = record.connection_id
            for name, happened in PUBLISH_COUNTERS.items():
                if happened(record):
                    self.counters[name][self._folded(connection_id, name)] += 1
            if record.outcome == r.ACKED and record.mode == r.CONFIRM and record.settle_latency_ns is not None:
                self._observe(CONFIRM_LATENCY, CONFIRM_BUCKETS, connection_id, record.settle_latency_ns)
        elif kind is r.Delivery:
            connection_id = record.connection_id
            for name, happened in DELIVERY_COUNTERS.items():
                if happened(record):
                    self.counters[name][self._folded(connection_id, name)] += 1
            if record.outcome in SETTLED and record.no_ack is False and record.settle_latency_ns is not None:
                self._observe(ACK_LATENCY, ACK_BUCKETS, connection_id, record.settle_latency_ns)
        elif kind is r.Violation:
            connection_id = record.connection_id
            self.counters[VIOLATION_COUNTER][self._folded(connection_id, VIOLATION_COUNTER)] += 1

    def _observe(self, name: str, buckets, connection_id: str, latency_ns: int) -> None:
        key = self._folded(connection_id, name)
        histogram = self.histograms[name].get(key)
        if histogram is None:
            histogram = self.histograms[name][key] = Histogram(buckets)
        histogram.observe(latency_ns / 1e9)

    # -- labels --------------------------------------------------------------------------------

    def where(self, connection_id: str) -> tuple[str, str]:
        """(vhost, application) of a connection, before the caps (cut to the length bound)."""
        facts = self.facts.get(connection_id) or {}
        app = labels.application(facts.get("connection_name"), facts.get("client_product"),
                                 facts.get("client_addr") if facts.get("client_product") else None)
        return labels.vhost(facts.get("vhost")), app

    def _folded(self, connection_id: str, metric: str) -> tuple[str, str]:
        """The series key of a connection's metric, after the caps; a folded series is counted once
        per metric. A connection the broker has not accepted gets labels without taking a slot, and
        its answer is not kept: the same names may be admitted once a connection with them is."""
        where = self.where(connection_id)
        if connection_id in self.opening:
            return self.caps.where(where, metric, admit=False)
        bit = self._metric_bits.get(metric)
        if bit is None:
            bit = self._metric_bits[metric] = 1 << len(self._metric_bits)
        known = self._labels.get(where)
        if known is not None and known[1] & bit:
            return known[0]
        if self._label_pairs > MAX_LABEL_CACHE:
            self._labels.clear()
            self._label_pairs = 0
            known = None
        capped = self.caps.where(where, metric)
        self._labels[where] = (capped, (known[1] if known is not None else 0) | bit)
        self._label_pairs += 1
        return capped

    # -- the open state, for a scrape ------------------------------------------------------------

    def gauges(self, now_ns: int) -> dict[str, dict]:
        """metric -> {label tuple: value} for the channels and connections open now."""
        unacked: Counter = Counter()
        oldest_unacked: dict = {}
        unconfirmed: Counter = Counter()
        oldest_unconfirmed: dict = {}
        prefetch: dict = {}
        consumers: Counter = Counter()
        blocked: Counter = Counter()
        for connection in open_connections(self.timelines):
            connection_id = connection.connection_id
            if connection.blocked_since_ns is not None:
                blocked[self._folded(connection_id, "ackscope_connection_blocked")] += 1
            for ch in connection.channels:
                if ch.unacked or ch.consumers:
                    role = "consumer" if ch.consumers else "get"
                    unacked[self._folded(connection_id, "ackscope_unacked_deliveries") + (role,)] += ch.unacked
                if ch.oldest_unacked_ts_ns is not None:
                    key = self._folded(connection_id, "ackscope_oldest_unacked_seconds")
                    oldest_unacked[key] = max(oldest_unacked.get(key, 0.0), (now_ns - ch.oldest_unacked_ts_ns) / 1e9)
                if ch.confirm_mode or ch.unconfirmed:
                    unconfirmed[self._folded(connection_id, "ackscope_unconfirmed_publishes")] += ch.unconfirmed
                if ch.oldest_unconfirmed_ts_ns is not None:
                    key = self._folded(connection_id, "ackscope_oldest_unconfirmed_seconds")
                    oldest_unconfirmed[key] = max(oldest_unconfirmed.get(key, 0.0),
                                                  (now_ns - ch.oldest_unconfirmed_ts_ns) / 1e9)
                if ch.consumers:
                    consumers[self._folded(connection_id, "ackscope_consumers")] += ch.consumers
                    limits = [p for p in (ch.consumer_prefetch, ch.channel_prefetch) if p is not None]
                    if limits:
                        # 0 is unlimited: the lowest limit in force is the one that binds, unless unlimited.
                        limit = min((p for p in limits if p), default=0)
                        key = self._folded(connection_id, "ackscope_prefetch_limit")
                        prefetch[key] = min(prefetch.get(key, limit), limit) if limit else 0
        return {
            "ackscope_unacked_deliveries": dict(unacked),
            "ackscope_oldest_unacked_seconds": oldest_unacked,
            "ackscope_unconfirmed_publishes": dict(unconfirmed),
            "ackscope_oldest_unconfirmed_seconds": oldest_unconfirmed,
            "ackscope_prefetch_limit": prefetch,
            "ackscope_consumers": dict(consumers),
            "ackscope_connection_blocked": dict(blocked),
        }

    def folded_series(self) -> dict[str, int]:
        return dict(self.caps.folded)

    def label_health(self) -> dict[str, dict[str, int]]:
        """The caps' own counts, for the agent's health metrics."""
        return {"label_folds": self.caps.folds_by_label(), "label_truncations": self.caps.truncations_by_label()}
