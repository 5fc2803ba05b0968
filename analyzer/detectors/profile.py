"""The unacked profile of one prefetch scope, folded as the events come: the most deliveries
unacked at once, and the longest time the scope sat at its prefetch limit with no ack.

The events are a delivery (order key 2 * seq, +1 unacked) and its settlement (key 2 * settle_seq
+ 1, -1; settle_seq >= seq, so a delivery's events never come before it). In key order (time
breaks ties) each event row lasts until the next row, the last one until the end of the data;
rows tied in key count together (a multiple ack settles many at once); a row is at the limit when
unacked >= limit > 0, and a run of such rows lasts from its first row's time to the latest
following time of its rows.

Records come out when final, not in key order, so events wait in `pending` until the caller says
every event below a key is in (`fold(horizon)`: detectors/__init__.py reads it off the state
machine). What is folded is running state only, bounded by the levels unacked reaches, not by how
many deliveries there were:
- `running`, `peak`, `last_time`;
- `stack`: the runs still open, one entry [level, since, latest following] per band of limits
  (the entry below's level, level] that share a start; levels rise from the bottom;
- `closed`: [lo, hi, stall] of finished runs: every limit in (lo, hi] sat that long once.
The limit is the largest prefetch any of the scope's deliveries had, known only at the end; it
only grows, so bands below it are dropped as it rises.
"""

from __future__ import annotations

from bisect import bisect_left

from .common import most

# `closed` is compacted (one band per stretch of limits) once it holds this many more than after
# the last compaction.
COMPACT_SLACK = 32


class Profile:
    __slots__ = ("limit", "end_ns", "pending", "running", "peak", "last_time", "stack", "closed", "compacted")

    def __init__(self):
        self.limit: int | None = None          # the largest prefetch of the scope's deliveries so far
        self.end_ns: int | None = None         # when the data ended for its open deliveries
        self.pending: list = []                # [key, time] not folded yet
        self.running = 0
        self.peak: int | None = None
        self.last_time: int | None = None      # the last folded row's time (its following time is unknown)
        self.stack: list = []                  # [level, since, latest following]
        self.closed: list = []                 # [lo, hi, stall]
        self.compacted = 0

    def add(self, key: int, time: int) -> None:
        self.pending.append((key, time))

    def fold(self, horizon: int | None) -> None:
        """Fold every pending event of key below `horizon` (None: all of them): the caller knows
        no event below it is still to come."""
        if not self.pending:
            return
        self.pending.sort()
        cut = len(self.pending) if horizon is None else bisect_left(self.pending, (horizon,))
        if cut == 0:
            return
        ready, self.pending = self.pending[:cut], self.pending[cut:]
        running, peak, stack = self.running, self.peak, self.stack
        start = 0
        while start < cut:
            key, end = ready[start][0], start
            while end < cut and ready[end][0] == key:
                end += 1
            running += (end - start) * (1 if key % 2 == 0 else -1)
            if peak is None or running > peak:
                peak = running
            for at in range(start, end):
                time = ready[at][1]
                if stack:  # the previous row lasted until now (a first row finds the stack empty)
                    top = stack[-1]
                    if top[2] is None or time > top[2]:
                        top[2] = time
                if stack and stack[-1][0] > running or running > (stack[-1][0] if stack else 0):
                    self._row(running, time)
            start = end
        self.running, self.peak, self.last_time = running, peak, ready[-1][1]
        self._prune()

    def _row(self, unacked: int, time: int) -> None:
        """A row whose level differs from the top band's: close the bands above it, or open one."""
        stack = self.stack
        while stack and stack[-1][0] > unacked:  # the runs of limits above `unacked` end here
            level, since, following = stack[-1]
            below = stack[-2][0] if len(stack) > 1 else 0
            self._closed(max(below, unacked), level, following - since)
            if below >= unacked:
                stack.pop()
                if stack:
                    stack[-1][2] = most(stack[-1][2], following)
            else:
                stack[-1][0] = unacked
                break
        if unacked > (stack[-1][0] if stack else 0):
            stack.append([unacked, time, None])

    def _closed(self, lo: int, hi: int, stall: int) -> None:
        if self.limit is not None and self.limit > 0:
            lo = max(lo, self.limit - 1)  # a limit never falls: bands below it never count
        if lo < hi:
            self.closed.append([lo, hi, stall])
            if len(self.closed) > self.compacted + COMPACT_SLACK:
                self.closed = _compacted(self.closed)
                self.compacted = len(self.closed)

    def _prune(self) -> None:
        if self.limit is not None and self.limit > 0:
            drop = 0
            while drop < len(self.stack) and self.stack[drop][0] < self.limit:
                drop += 1
            del self.stack[:drop]

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


def _compacted(closed: list) -> list:
    """The same answers in fewer bands: each stretch between two band edges once, its longest stall."""
    edges = sorted({edge for lo, hi, _ in closed for edge in (lo, hi)})
    out = []
    for lo, hi in zip(edges, edges[1:]):
        stall = None
        for a, b, value in closed:
            if a <= lo and hi <= b:
                stall = most(stall, value)
        if stall is None:
            continue
        if out and out[-1][1] == lo and out[-1][2] == stall:
            out[-1][1] = hi
        else:
            out.append([lo, hi, stall])
    return out
