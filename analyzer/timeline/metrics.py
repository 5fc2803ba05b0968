"""channel_metrics (schema.CHANNEL_METRICS) from one connection's timeline records, sans-IO.

The columns are defined in schema.py; this reads the records the state machine emits (Delivery,
Publish, ChannelFacts, in any order) and applies no rule of its own about what settles what.

How a bucket's row is made:
- Every record adds events to the bucket they fall in: an arrival (+1 to its level if it counts as
  outstanding at all), a settle (-1) at the later of its settle point and its own row, an
  incarnation's open and end. Counts are summed as they come; the level changes are kept per
  bucket and ordered only when the bucket is closed, one bucket at a time (a hot channel's
  millions of items are never sorted as one list).
- A bucket's level peak is the largest running level over its instants, where everything at the
  same (ts, seq) counts at once (a multiple ack settles all its tags together).
- The oldest item outstanding at a bucket's end is the first, in arrival order, not settled by
  then: arrivals are queued in arrival order as their bucket closes and dropped from the front once
  settled, so the front is the answer.
- Buckets without events get a row only between two with events, while something is outstanding.

Streaming: `ChannelMetrics` is fed records as they come and told, with `advance(horizon_ns, held)`,
that no record fed later has anything before `horizon_ns` (or, for an incarnation in `held`, before
its own horizon); it then returns the rows that became final.
A record that breaks that promise raises `HorizonError` instead of giving a wrong row.
`finish()` closes everything. `channel_metrics()` is feed-everything-then-finish.
"""

from __future__ import annotations

from collections import deque
from itertools import accumulate
from collections.abc import Iterable, Mapping

import pyarrow as pa

from .. import folds, schema
from ..rows import dicts_to_table
from . import records as r

NS_PER_SECOND = 1_000_000_000
NEVER = 2**63 - 1  # settle time of what is still outstanding when the data ends
# An instant (ts_ns, seq) as one int that orders like the pair (ints sort much faster than tuples),
# ts * 2**65 + 2 * (seq + 1), a missing seq first as Spark's nulls; + 1 for an arrival, so that at
# one instant departures come before arrivals: then no running level in the middle of an instant
# exceeds the level after it, and a bucket's peak is a plain running maximum.
_TS_SCALE = 1 << 65
_SEQ_MASK = _TS_SCALE - 1
_DELTA = (-1, 1)  # by the arrival bit
# An outstanding item as one int too, (arrival instant << 64) + settle ts + 2**63 (NEVER fits):
# a third of a tuple's memory, and it sorts by arrival.
_SETTLE_BITS = 64
_SETTLE_MASK = (1 << _SETTLE_BITS) - 1
_SETTLE_OFFSET = 1 << 63
_ARRIVAL_OF = (_SETTLE_BITS).__rrshift__  # item -> its arrival instant

COUNTS = ("deliveries", "redeliveries", "deliveries_unknown", "acks", "nacks", "rejects", "requeues",
          "publishes", "returns", "publishes_unknown", "confirms", "confirm_nacks", "lost")
(DELIVERIES, REDELIVERIES, DELIVERIES_UNKNOWN, ACKS, NACKS, REJECTS, REQUEUES,
 PUBLISHES, RETURNS, PUBLISHES_UNKNOWN, CONFIRMS, CONFIRM_NACKS, LOST) = range(len(COUNTS))
# The count a settle adds, by outcome (others add none).
_DELIVERY_SETTLE_COUNT = {r.ACK: ACKS, r.NACK: NACKS, r.REJECT: REJECTS}
_PUBLISH_SETTLE_COUNT = {r.ACKED: CONFIRMS, r.NACKED: CONFIRM_NACKS, r.LOST: LOST}
LEVELS = ("unacked", "unconfirmed")
UNKNOWN, CONFIRM = r.UNKNOWN, r.CONFIRM
UNACKED, UNCONFIRMED = 0, 1


class HorizonError(ValueError):
    """A record has something before a horizon the caller promised (the caller's fault): a row
    already returned as final would change."""


def bucket_ns_of(bucket_seconds) -> int:
    if not isinstance(bucket_seconds, int) or isinstance(bucket_seconds, bool) or bucket_seconds < 1:
        raise ValueError(f"bucket_seconds must be a whole number of seconds >= 1, not {bucket_seconds!r}")
    return bucket_seconds * NS_PER_SECOND


def arrival_parts(key: int) -> tuple[int, int]:
    """(ts_ns, seq) of an arrival's instant."""
    return key >> 65, ((key & _SEQ_MASK) >> 1) - 1


class _Bucket:
    """What one bucket of one incarnation has seen so far."""
    __slots__ = ("counts", "arrivals", "departures", "deliver_at", "consumer_prefetch", "channel_prefetch",
                 "observed_until")

    def __init__(self):
        self.counts = [0] * len(COUNTS)
        self.arrivals = ([], [])      # per level: the items (as above) that start being outstanding
        self.departures = ([], [])    # per level: instant of what stops
        self.deliver_at = None        # arrival instant of the latest basic.deliver in it
        self.consumer_prefetch = self.channel_prefetch = None  # of that basic.deliver
        self.observed_until = None


class _Incarnation:
    """One channel incarnation's buckets not final yet, and what the final ones leave in force."""
    __slots__ = ("key", "buckets", "levels", "oldest", "queues", "prefetch", "idle_from", "announced", "ended",
                 "final_before")

    def __init__(self, key: tuple):
        self.key = key                        # (connection_id, agent_id, channel, incarnation)
        self.buckets: dict[int, _Bucket] = {}
        self.levels = [0, 0]                  # at the end of the last closed bucket
        self.oldest = [None, None]            # instant of the oldest outstanding then (None: nothing)
        self.queues = (deque(), deque())      # per level: items in arrival order
        self.prefetch = None                  # of the last basic.deliver in a closed bucket
        self.idle_from = None                 # first bucket after the last row, if rows may follow
        self.announced = None                 # open instant told by `opened` (its ChannelFacts adds no event)
        self.ended = False                    # its ChannelFacts came: the machine emits nothing of it after them
        self.final_before = None              # its buckets starting before this are closed (None: none yet)

    def bucket(self, start: int) -> _Bucket:
        b = self.buckets.get(start)
        if b is None:
            b = self.buckets[start] = _Bucket()
        return b


class ChannelMetrics:
    """Rows of schema.CHANNEL_METRICS, as dicts without the derived `date` and `bucket_start`."""
    __slots__ = ("bucket_seconds", "size", "incarnations", "retired", "_last", "_last_inc")

    def __init__(self, bucket_seconds: int = 10):
        self.bucket_seconds = bucket_seconds
        self.size = bucket_ns_of(bucket_seconds)
        self.incarnations: dict[tuple, _Incarnation] = {}
        self.retired: set[tuple] = set()  # incarnations ended and closed: forgotten, so memory stays bounded
        self._last = self._last_inc = None  # the last record fed and its incarnation

    # -- records in ---------------------------------------------------------------------------------

    def feed(self, records: Iterable) -> None:
        for x in records:
            self.record(x)

    def record(self, x) -> None:
        """One record (Delivery, Publish, ChannelFacts; others are ignored): in C where _folds.c
        takes it (analyzer/folds.py), else `python_record`."""
        if _fold_in_c is None or not _fold_in_c(self, x):
            self.python_record(x)

    def python_record(self, x) -> None:
        """One record, the rules' one statement (the C twin is held to it)."""
        kind = type(x)
        if kind is r.Delivery:
            self._delivery(x)
        elif kind is r.Publish:
            self._publish(x)
        elif kind is r.ChannelFacts:
            self._facts(x)

    def opened(self, connection_id: str, agent_id: str | None, channel: int, incarnation: int,
               open_ts_ns: int, open_seq: int) -> None:
        """An incarnation began (its ChannelFacts come only when it ends): its open bucket gets a row
        even if nothing else happens there, without holding every later bucket back."""
        inc = self._incarnation((connection_id, agent_id, channel, incarnation))
        at = (open_ts_ns, open_seq)
        if inc.announced is None:
            self._check(open_ts_ns, inc)
            inc.announced = at
            inc.bucket(open_ts_ns - open_ts_ns % self.size)

    def _incarnation(self, key: tuple) -> _Incarnation:
        inc = self.incarnations.get(key)
        if inc is None:
            if key in self.retired:
                raise HorizonError(f"connection {key[0]} channel {key[2]} incarnation {key[3]}: a record after "
                                   f"its ChannelFacts, whose rows are all out")
            inc = self.incarnations[key] = _Incarnation(key)
        return inc

    @staticmethod
    def _check(ts_ns: int, inc: _Incarnation) -> None:
        if inc.final_before is not None and ts_ns < inc.final_before:
            key = inc.key
            raise HorizonError(f"connection {key[0]} channel {key[2]} incarnation {key[3]}: a record at ts_ns "
                               f"{ts_ns} falls before the horizon {inc.final_before} already passed")

    def _of(self, x) -> _Incarnation:
        """The record's incarnation; records come in runs of one, so the last one is tried first
        (no key tuple per record: allocations are what the garbage collector counts)."""
        last = self._last
        if (last is not None and x.incarnation == last.incarnation and x.channel == last.channel
                and x.connection_id == last.connection_id and x.agent_id == last.agent_id):
            return self._last_inc
        key = (x.connection_id, x.agent_id, x.channel, x.incarnation)
        inc = self.incarnations.get(key) or self._incarnation(key)
        self._last, self._last_inc = x, inc
        return inc

    def _delivery(self, d: r.Delivery) -> None:
        inc = self._of(d)
        size, ts, seq = self.size, d.ts_ns, d.seq
        settle_ts = d.settle_ts_ns
        if settle_ts is not None:
            settle_seq = d.settle_seq
            if settle_ts < ts:  # never settled before its own row
                settle_ts, settle_seq = ts, seq
        if inc.final_before is not None:
            self._check(ts if settle_ts is None else min(ts, settle_ts), inc)
        start = ts - ts % size
        b = inc.buckets.get(start) or inc.bucket(start)
        counts = b.counts
        counts[DELIVERIES] += 1
        if d.redelivered:
            counts[REDELIVERIES] += 1
        outcome = d.outcome
        known = outcome != UNKNOWN
        if not known:
            counts[DELIVERIES_UNKNOWN] += 1
        arrived = ts * _TS_SCALE + seq * 2 + 3
        if d.method == "basic.deliver" and (b.deliver_at is None or arrived > b.deliver_at):
            b.deliver_at, b.consumer_prefetch, b.channel_prefetch = arrived, d.consumer_prefetch, d.channel_prefetch
        counted = ever_outstanding(d)
        if settle_ts is None:
            if counted:
                b.arrivals[UNACKED].append((arrived << _SETTLE_BITS) + NEVER + _SETTLE_OFFSET)
            return
        if counted:
            b.arrivals[UNACKED].append((arrived << _SETTLE_BITS) + settle_ts + _SETTLE_OFFSET)
        settled = settle_ts - settle_ts % size
        s = b if settled == start else (inc.buckets.get(settled) or inc.bucket(settled))
        if counted:
            s.departures[UNACKED].append(settle_ts * _TS_SCALE + (0 if settle_seq is None else settle_seq * 2 + 2))
        which = _DELIVERY_SETTLE_COUNT.get(outcome)
        if which is not None:
            s.counts[which] += 1
            if which != ACKS and d.requeue:
                s.counts[REQUEUES] += 1

    def _publish(self, p: r.Publish) -> None:
        inc = self._of(p)
        size, ts, seq = self.size, p.ts_ns, p.seq
        settle_ts = p.settle_ts_ns
        if settle_ts is not None:
            settle_seq = p.settle_seq
            if settle_ts < ts:
                settle_ts, settle_seq = ts, seq
        if inc.final_before is not None:
            self._check(ts if settle_ts is None else min(ts, settle_ts), inc)
        start = ts - ts % size
        b = inc.buckets.get(start) or inc.bucket(start)
        counts = b.counts
        counts[PUBLISHES] += 1
        if p.return_seq is not None:
            counts[RETURNS] += 1
        outcome = p.outcome
        known = outcome != UNKNOWN
        if not known:
            counts[PUBLISHES_UNKNOWN] += 1
        counted = ever_outstanding(p)
        if counted:
            b.arrivals[UNCONFIRMED].append(((ts * _TS_SCALE + seq * 2 + 3) << _SETTLE_BITS)
                                           + (NEVER if settle_ts is None else settle_ts) + _SETTLE_OFFSET)
        if settle_ts is None:
            return
        settled = settle_ts - settle_ts % size
        s = b if settled == start else (inc.buckets.get(settled) or inc.bucket(settled))
        if counted:
            s.departures[UNCONFIRMED].append(settle_ts * _TS_SCALE + (0 if settle_seq is None else settle_seq * 2 + 2))
        which = _PUBLISH_SETTLE_COUNT.get(outcome)
        if which is not None:
            s.counts[which] += 1

    def _facts(self, c: r.ChannelFacts) -> None:
        inc = self._incarnation((c.connection_id, c.agent_id, c.channel, c.incarnation))
        inc.ended = True
        size = self.size
        if inc.announced != (c.open_ts_ns, c.open_seq):
            self._check(c.open_ts_ns, inc)
            inc.bucket(c.open_ts_ns - c.open_ts_ns % size)
        # The end of the data ends an incarnation still open; that instant is also what its last
        # bucket's end-of-bucket values describe.
        end = c.end_ts_ns if c.end_ts_ns is not None else c.observed_until_ts_ns
        if end is not None:
            self._check(end, inc)
            b = inc.bucket(end - end % size)
            until = c.observed_until_ts_ns
            if until is not None and (b.observed_until is None or until > b.observed_until):
                b.observed_until = until

    # -- rows out -----------------------------------------------------------------------------------

    def advance(self, horizon_ns: int | None, held: Mapping[tuple[int, int], int] | None = None) -> list[dict]:
        """No record fed from now on has an arrival, settle, open or end before `horizon_ns`, nor,
        for the (channel, incarnation) keys of `held`, before their value: the rows of every bucket
        that ends by then, and of the quiet ones before them, are final. (An incarnation's own held
        items hold back its rows only, never its neighbours'.) None: no frame yet, nothing final."""
        out: list[dict] = []
        if horizon_ns is None:
            return out
        for inc in list(self.incarnations.values()):
            horizon = horizon_ns
            if held:
                own = held.get((inc.key[2], inc.key[3]))
                if own is not None and own < horizon:
                    horizon = own
            before = horizon - horizon % self.size
            if inc.final_before is not None and before <= inc.final_before:
                continue
            inc.final_before = before
            self._close_buckets(inc, before, out)
            if inc.buckets:  # quiet buckets up to the next one with events are final too
                self._idle_rows(inc, min(min(inc.buckets), before), out)
            elif inc.ended:  # no row follows the last event
                del self.incarnations[inc.key]
                self.retired.add(inc.key)
                self._last = self._last_inc = None
        return out

    def finish(self) -> list[dict]:
        """The data ends: every remaining row, and nothing after an incarnation's last event."""
        out: list[dict] = []
        for inc in self.incarnations.values():
            self._close_buckets(inc, None, out)
        self.incarnations = {}
        self._last = self._last_inc = None
        return out

    def _close_buckets(self, inc: _Incarnation, before: int | None, out: list) -> None:
        for start in sorted(inc.buckets):
            if before is not None and start >= before:
                break
            self._idle_rows(inc, start, out)
            out.append(self._close(inc, start, inc.buckets.pop(start)))

    def _idle_rows(self, inc: _Incarnation, until: int, out: list) -> None:
        """Rows of the quiet buckets from inc.idle_from up to `until`: the last closed bucket's
        levels and oldest items, nothing counted."""
        start = inc.idle_from
        if start is None:
            return
        while start < until:
            out.append(self._row(inc, start, start + self.size, _NO_COUNTS, tuple(inc.levels)))
            start += self.size
        inc.idle_from = start

    def _close(self, inc: _Incarnation, start: int, b: _Bucket) -> dict:
        end = start + self.size
        peaks = []
        for level in (UNACKED, UNCONFIRMED):
            arrivals, departures = b.arrivals[level], b.departures[level]
            before = inc.levels[level]
            if not arrivals and not departures:
                peaks.append(before)
                continue
            arrivals.sort()
            change = None if _peak_change_in_c is None else _peak_change_in_c(arrivals, departures)
            if change is None:
                change = _peak_change(arrivals, departures)
            peaks.append(before + max(0, change))
            inc.levels[level] = before + len(arrivals) - len(departures)
            inc.oldest[level] = _oldest_after(inc.queues[level], arrivals, end, inc.levels[level])
        if b.deliver_at is not None:
            inc.prefetch = (b.consumer_prefetch, b.channel_prefetch)
        row = self._row(inc, start, end, b.counts, peaks, b.observed_until)
        outstanding = inc.levels[UNACKED] > 0 or inc.levels[UNCONFIRMED] > 0
        inc.idle_from = end if outstanding else None
        return row

    def _row(self, inc: _Incarnation, start: int, end: int, counts, peaks, observed_until=None) -> dict:
        as_of = end if observed_until is None else min(end, observed_until)
        connection_id, agent_id, channel, incarnation = inc.key
        consumer_prefetch, channel_prefetch = inc.prefetch or (None, None)
        row = {"bucket_start_ns": start, "bucket_seconds": self.bucket_seconds, "connection_id": connection_id,
               "agent_id": agent_id, "channel": channel, "incarnation": incarnation, "as_of_ns": as_of,
               "consumer_prefetch": consumer_prefetch, "channel_prefetch": channel_prefetch}
        for level, name in enumerate(LEVELS):
            oldest = inc.oldest[level] if inc.levels[level] > 0 else None
            ts, seq = arrival_parts(oldest) if oldest is not None else (None, None)
            row[name] = inc.levels[level]
            row[name + "_max"] = peaks[level]
            row[f"oldest_{name}_age_ns"] = None if ts is None else as_of - ts
            row[f"oldest_{name}_seq"] = seq
        row.update(zip(COUNTS, counts))
        return row


_NO_COUNTS = (0,) * len(COUNTS)


def ever_outstanding(item) -> bool:
    """Whether a delivery or publish ever counts as outstanding (unacked, unconfirmed): a manual-ack
    delivery or a publish in confirm mode, with a known outcome (an unknown one cannot say how long
    it was, and neither can a delivery whose ack mode is unknown). One that never does adds to its
    arrival's bucket (and its settle's) only: what a checkpoint need not carry (carry.py)."""
    if isinstance(item, r.Delivery):
        return item.no_ack is False and item.outcome != UNKNOWN
    return item.mode == CONFIRM and item.outcome != UNKNOWN


# `_delivery` and `_publish` in C, for the records it takes (None: not built, or switched off).
_fold_in_c = folds.metrics_fold(ChannelMetrics, _Incarnation, _Bucket, COUNTS)
# `_peak_change` in C, for the ints it reads (None: not built, or switched off).
_peak_change_in_c = folds.peak_change()


def _peak_change(arrivals: list, departures: list) -> int:
    """The largest running sum of +1 per arrival and -1 per departure in instant order, taken only
    after everything at one instant (the encoding puts an instant's departures first)."""
    if not departures:
        return len(arrivals)
    if not arrivals:
        return 0
    instants = list(map(_ARRIVAL_OF, arrivals))
    instants += departures
    instants.sort()
    return max(accumulate(map(_DELTA.__getitem__, map((1).__and__, instants))))


def _oldest_after(queue: deque, arrivals: list, end: int, level: int) -> int | None:
    """The instant of the first item, in arrival order, still outstanding at `end` (None if none).
    What settled before `end` leaves the front for good, since later ends are later still; what
    settled behind an older item still outstanding is swept out once it is most of the queue."""
    queue.extend(arrivals)
    settled_by = end + _SETTLE_OFFSET  # an item settled before `end` has a lower settle part
    while queue and queue[0] & _SETTLE_MASK < settled_by:
        queue.popleft()
    if len(queue) > 2 * level + 1024:
        kept = [x for x in queue if x & _SETTLE_MASK >= settled_by]
        queue.clear()
        queue.extend(kept)
    return queue[0] >> _SETTLE_BITS if queue and level > 0 else None


def channel_metrics(records: Iterable, bucket_seconds: int = 10) -> list[dict]:
    """Every row for these records (one connection's, or several), sorted by incarnation and bucket."""
    metrics = ChannelMetrics(bucket_seconds)
    metrics.feed(records)
    return sorted(metrics.finish(), key=_row_order)


def _row_order(row: dict) -> tuple:
    return (row["connection_id"], row["agent_id"] is None, row["agent_id"] or "", row["channel"],
            row["incarnation"], row["bucket_start_ns"])


def to_table(rows: list[dict]) -> pa.Table:
    return dicts_to_table(rows, schema.CHANNEL_METRICS, schema.CHANNEL_METRIC_TIMESTAMPS,
                          schema.CHANNEL_METRIC_DATE_FROM)
