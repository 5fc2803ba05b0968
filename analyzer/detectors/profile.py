"""The unacked profile of one prefetch scope, folded as the events come: the most deliveries
unacked at once, and the longest time the scope sat at its prefetch limit with no ack.

The events are a delivery (order key 2 * seq, +1 unacked) and its settlement (key 2 * settle_seq
+ 1, -1; settle_seq >= seq, so a delivery's events never come before it). In key order (time
breaks ties) each event row lasts until the next row, the last one until the end of the data;
rows tied in key count together (a multiple ack settles many at once); a row is at the limit when
unacked >= limit > 0, and a run of such rows lasts from its first row's time to the latest
following time of its rows.

Records come out when final, not in key order, so events wait (`keys`, `times`) until the caller
says every event below a key is in (`fold(horizon)`: detectors/__init__.py reads it off the state
machine). What is folded is running state only, bounded by the levels unacked reaches, not by how
many deliveries there were:
- `running`, `peak`, `last_time`;
- `stack`: the runs still open, one entry [level, since, latest following] per band of limits
  (the entry below's level, level] that share a start; levels rise from the bottom;
- `closed`: [lo, hi, stall] of finished runs, disjoint and ascending: every limit in (lo, hi] sat
  at most that long in one run.
The limit is the largest prefetch any of the scope's deliveries had, known only at the end; it
only grows, so levels below it count as one level just below it ("the floor").

`python_fold` is the rules' statement; `fold` runs its C twin (_profile.c: the same runs off one
stack pass, O(n)) where it is built, held to it by tests/test_detector_folds.py. `python_fold`
takes its events whole, as arrays (numpy): the unacked level of every row is a cumulative
sum; the runs of every limit at once are the nodes of the rows' Cartesian tree by level (a row p
and the rows around it down to the nearest lower level on each side are the run of the limits
between the higher of those two levels and p's own), found with range-minimum tables; each run's
stall is a range maximum of the following times. The open runs carried from the last fold come
first, as one row each (its level, its start, its latest following), and the rows sit on a row at
the floor, so a run may begin in an earlier fold and end in this one, or stay open for the next.
"""

from __future__ import annotations

import numpy as np

from .. import pure_python
from .common import most

try:
    from . import _profile
except ImportError:  # not compiled
    _profile = None

# A row whose following time is not known yet (the last row folded, a run's first row on its own).
NO_TIME = np.iinfo(np.int64).min
# Times are int64 nanoseconds; a stall is a difference of two of them, so a fold refuses times
# farther apart than int64 can subtract.
MAX_TIME_SPAN = 2 ** 62


class Profile:
    __slots__ = ("limit", "end_ns", "keys", "times", "running", "peak", "last_time", "stack", "closed")

    def __init__(self):
        self.limit: int | None = None          # the largest prefetch of the scope's deliveries so far
        self.end_ns: int | None = None         # when the data ended for its open deliveries
        self.keys: list[int] = []              # the events not folded yet: order keys,
        self.times: list[int] = []             # and their times
        self.running = 0
        self.peak: int | None = None
        self.last_time: int | None = None      # the last folded row's time (its following time is unknown)
        self.stack: list = []                  # [level, since, latest following]
        self.closed: list = []                 # [lo, hi, stall]

    def add(self, key: int, time: int) -> None:
        self.keys.append(key)
        self.times.append(time)

    def fold(self, horizon: int | None) -> None:
        """Fold every waiting event of key below `horizon` (None: all of them): the caller knows
        no event below it is still to come. In C where _profile.c takes the state, else `python_fold`."""
        if not self.keys:
            return
        if _fold_in_c is not None:
            folded = _fold_in_c(self.keys, self.times, horizon, self.floor(), self.running, self.peak, self.last_time,
                                self.stack, self.closed)
            if folded is not None:
                self.keys, self.times, self.running, self.peak, self.last_time, self.stack, self.closed = folded
                return
        self.python_fold(horizon)

    def floor(self) -> int:
        """The level every limit at or below the scope's largest prefetch counts as: runs at or
        below it are never asked for."""
        return self.limit - 1 if self.limit is not None and self.limit > 0 else 0

    def python_fold(self, horizon: int | None) -> None:
        """`fold`, the rules' one statement (the C twin is held to it)."""
        if not self.keys:
            return
        keys, times = np.array(self.keys, np.int64), np.array(self.times, np.int64)
        if horizon is None:
            self.keys, self.times = [], []
        else:
            ready = keys < horizon
            if not ready.all():
                if not ready.any():
                    return
                later = ~ready
                self.keys, self.times = keys[later].tolist(), times[later].tolist()
                keys, times = keys[ready], times[ready]
            else:
                self.keys, self.times = [], []
        order = np.lexsort((times, keys))
        keys, times = keys[order], times[order]
        # Each row's unacked level: the running count after the last event of its key.
        after = self.running + np.cumsum(1 - 2 * (keys & 1))
        last_of_key = np.flatnonzero(np.append(keys[1:] != keys[:-1], True))
        levels = np.repeat(after[last_of_key], np.diff(last_of_key, prepend=-1))
        self.running, self.last_time = int(after[-1]), int(times[-1])
        self.peak = most(self.peak, int(levels.max()))
        self._runs(levels, times)

    def _runs(self, levels: np.ndarray, times: np.ndarray) -> None:
        """The runs of every limit above the floor among these rows (and the open ones before
        them): those that end here into `closed`, those still open into `stack`."""
        floor = self.floor()
        stack = self.stack
        if not stack and levels.max() <= floor:
            return  # no run above the floor goes on or begins
        n = 1 + len(stack) + len(levels)
        level = np.empty(n, np.int64)
        start = np.empty(n, np.int64)
        following = np.full(n, NO_TIME, np.int64)
        level[0], start[0] = floor, 0
        if stack:
            carried = np.array([[s[0], s[1], NO_TIME if s[2] is None else s[2]] for s in stack], np.int64)
            level[1:len(stack) + 1], start[1:len(stack) + 1] = carried[:, 0], carried[:, 1]
            following[1:len(stack) + 1] = carried[:, 2]
            # The last row folded before lasted until this fold's first row.
            following[len(stack)] = max(following[len(stack)], times[0])
        first = len(stack) + 1
        level[first:] = levels
        np.maximum(level, floor, out=level)
        start[first:] = times
        following[first:-1] = times[1:]
        span = np.concatenate((start[1:], following[following != NO_TIME]))
        if int(span.max()) - int(span.min()) >= MAX_TIME_SPAN:
            raise ValueError("unacked profile: event times too far apart to subtract as int64 nanoseconds")

        lowest = _table(level, np.minimum, NO_TIME)
        below = _previous_at_most(level, lowest)
        ends = _next_lower(level, lowest)
        # A run per row that is the first of its run's lowest rows (the row before the run is lower).
        row = np.arange(1, n)
        row = row[level[below[row]] < level[row]]
        first_row, end = below[row] + 1, ends[row]
        latest = _range_max(_table(following, np.maximum, NO_TIME), first_row, end - 1)
        shut = end < n
        if shut.any():
            lo = np.maximum(level[below[row[shut]]], level[end[shut]])
            stall = latest[shut] - start[first_row[shut]]
            old = np.array(self.closed, np.int64).reshape(-1, 3)
            self.closed = _compacted(np.concatenate((old[:, 0], lo)), np.concatenate((old[:, 1], level[row[shut]])),
                                     np.concatenate((old[:, 2], stall)), floor)
        still = ~shut
        self.stack = [[lv, since, None if f == NO_TIME else f] for lv, since, f in zip(
            level[row[still]].tolist(), start[first_row[still]].tolist(), latest[still].tolist())]

    def result(self) -> tuple[int, int | None]:
        """(most unacked at once, longest time at the limit with no ack or None), with every event
        folded (`fold(None)` first). Reads the state only."""
        peak = self.peak if self.peak is not None else 0
        limit = self.limit
        if limit is None or limit <= 0:
            return peak, None
        stall = None
        for lo, hi, value in self.closed:
            if lo < limit <= hi:
                stall = most(stall, value)
        # The run still open for this limit: from its band's start to the latest following time of
        # its rows and of every band above it (their rows are its rows too), the last row lasting
        # until the end of the data.
        last = self.end_ns if self.end_ns is not None else self.last_time
        following = last
        for at in range(len(self.stack) - 1, -1, -1):
            level, since, latest = self.stack[at]
            below = self.stack[at - 1][0] if at > 0 else 0
            following = most(following, latest)
            if below < limit <= level:
                stall = most(stall, following - since)
                break
        return peak, stall


# `fold` in C (None: not built, or switched off by ACKSCOPE_PURE_PYTHON).
_fold_in_c = None if _profile is None or pure_python() else _profile.fold


def _table(values: np.ndarray, op, pad: int) -> np.ndarray:
    """Sparse table: row k, column i holds `op` over values[i : i + 2**k]; `pad` where that runs
    past the end, and in one extra column (an index past the end reads it)."""
    n = len(values)
    table = np.full((max(n.bit_length(), 1), n + 1), pad, np.int64)
    table[0, :n] = values
    for k in range(1, len(table)):
        width = 1 << (k - 1)
        op(table[k - 1, :n - 2 * width + 1], table[k - 1, width:n - width + 1], out=table[k, :n - 2 * width + 1])
    return table


def _next_lower(level: np.ndarray, lowest: np.ndarray) -> np.ndarray:
    """For each row, the first row after it with a lower level (len(level) if none): skip the
    largest blocks of rows none of which is lower (`lowest`: the minimum table, pad below any level)."""
    n = len(level)
    at = np.arange(1, n + 1)
    for k in range(len(lowest) - 1, -1, -1):
        at += np.where(lowest[k, np.minimum(at, n)] >= level, 1 << k, 0)
    return at


def _previous_at_most(level: np.ndarray, lowest: np.ndarray) -> np.ndarray:
    """For each row, the last row before it with a level not above its own (-1 if none)."""
    n = len(level)
    at = np.arange(n)  # the rows from `at` up to the row itself are known higher
    for k in range(len(lowest) - 1, -1, -1):
        block = at - (1 << k)
        at -= np.where(lowest[k, np.where(block < 0, n, block)] > level, 1 << k, 0)
    return at - 1


def _range_max(table: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The maximum over rows first..last (inclusive, first <= last) of each pair, from its sparse table."""
    k = np.frexp((last - first + 1).astype(np.float64))[1] - 1  # floor(log2(length)), exact below 2**53
    return np.maximum(table[k, first], table[k, last - (1 << k) + 1])


def _compacted(lo: np.ndarray, hi: np.ndarray, stall: np.ndarray, floor: int) -> list:
    """Closed runs as few disjoint bands, ascending: each stretch between two band edges above the
    floor once, with the longest stall of the bands over it; neighbours of equal stall merged."""
    lo = np.maximum(lo, floor)
    keep = lo < hi
    lo, hi, stall = lo[keep], hi[keep], stall[keep]
    if not len(lo):
        return []
    edges = np.unique(np.concatenate((lo, hi)))
    first, end = np.searchsorted(edges, lo), np.searchsorted(edges, hi)  # stretches first..end-1
    stretches = len(edges) - 1
    # The most of each band onto the two blocks of 2**k stretches that cover it, then blocks
    # handed down to their halves: row 0 is each stretch's most.
    k = np.frexp((end - first).astype(np.float64))[1] - 1
    most_of = np.full((max(stretches.bit_length(), 1), stretches), NO_TIME, np.int64)
    np.maximum.at(most_of, (k, first), stall)
    np.maximum.at(most_of, (k, end - (1 << k)), stall)
    for row in range(len(most_of) - 1, 0, -1):
        half = 1 << (row - 1)
        np.maximum(most_of[row - 1], most_of[row], out=most_of[row - 1])
        np.maximum(most_of[row - 1, half:], most_of[row, :stretches - half], out=most_of[row - 1, half:])
    values = most_of[0]
    covered = values != NO_TIME
    opens = covered & ~np.append(False, covered[:-1] & (values[1:] == values[:-1]))
    band_of = np.cumsum(opens) - 1
    starts = np.flatnonzero(opens)
    tops = np.zeros(len(starts), np.int64)
    np.maximum.at(tops, band_of[covered], np.flatnonzero(covered) + 1)
    return [[a, b, c] for a, b, c in zip(edges[starts].tolist(), edges[tops].tolist(), values[starts].tolist())]
