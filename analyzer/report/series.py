"""Numbers behind the pictures, kept small whatever the lake's size: counts outstanding over time
reduced to one value per pixel column, latency histograms with fixed log-spaced bins, and
out-of-order distances in powers of two.

The outstanding counts follow the channel_metrics rules (analyzer/schema.py, CHANNEL_METRICS): an
item counts from its own row until it settled, or to the end of the data if it never did; the
caller leaves out what those rules leave out (auto-ack, unknown outcomes). tests/test_report.py
checks these series against channel_metrics at every bucket end, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLUMNS = 480  # pixel columns of a time chart: finer than that cannot be seen


@dataclass
class StepSeries:
    """value[i] holds from times_ns[i] until times_ns[i + 1] (and to `end_ns` for the last)."""
    times_ns: np.ndarray
    values: np.ndarray
    end_ns: int
    peak_per_column: bool = False    # reduced: each point is the most outstanding within its column

    @property
    def peak(self) -> int:
        return int(self.values.max()) if len(self.values) else 0

    def value_at(self, t_ns: int) -> int:
        """The count once everything before t_ns has happened (the channel_metrics 'end of bucket')."""
        i = np.searchsorted(self.times_ns, t_ns, side="left") - 1
        return int(self.values[i]) if i >= 0 else 0


def outstanding(starts_ns: np.ndarray, settles_ns: np.ndarray, end_ns: int, columns: int = COLUMNS) -> StepSeries:
    """How many items are outstanding over time: +1 at each start, -1 at its settle (NaN/negative:
    never settled, outstanding to `end_ns`). Exact when the events fit the columns, else reduced to
    each column's peak so no spike is lost."""
    starts = np.asarray(starts_ns, dtype=np.int64)
    settles = np.asarray(settles_ns, dtype=np.int64)
    settles = settles[settles >= 0]
    times = np.concatenate([starts, settles])
    deltas = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(settles), np.int64)])
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(deltas[order])
    # One point per distinct instant: the count once all of that instant's events happened.
    last_of_instant = np.append(times[1:] != times[:-1], True)
    times, running = times[last_of_instant], running[last_of_instant]
    series = StepSeries(times, running, int(max(end_ns, times[-1] if len(times) else end_ns)))
    return reduce_to_columns(series, columns)


def reduce_to_columns(series: StepSeries, columns: int = COLUMNS) -> StepSeries:
    """The series as the peak of each of `columns` equal slices of its time span (as it is if it
    has few enough points)."""
    if len(series.times_ns) <= 2 * columns:
        return series
    t0, t1 = int(series.times_ns[0]), series.end_ns
    width = max(1, t1 - t0)
    edges = t0 + (np.arange(columns, dtype=np.float64) * width / columns).astype(np.int64)
    column = np.minimum(((series.times_ns - t0).astype(np.float64) * columns / width).astype(np.int64), columns - 1)
    peaks = np.zeros(columns, np.int64)
    np.maximum.at(peaks, column, series.values)
    # A column with no event of its own still holds what was outstanding when it began.
    carried_in = np.searchsorted(series.times_ns, edges, side="left") - 1
    at_start = np.where(carried_in >= 0, series.values[np.maximum(carried_in, 0)], 0)
    return StepSeries(edges, np.maximum(peaks, at_start), t1, peak_per_column=True)


def changes(times_ns: np.ndarray, values: np.ndarray) -> list[tuple[int, int]]:
    """(time, value) where a value first appears or changes: a prefetch limit in force over time."""
    out: list[tuple[int, int]] = []
    for t, v in zip(times_ns.tolist(), values.tolist()):
        if v is not None and (not out or out[-1][1] != v):
            out.append((t, v))
    return out


# Latency bins: three per decade from 10 microseconds to 1000 seconds; what falls outside goes into
# the first or last bin (their labels say "<" and ">").
LATENCY_EDGES_NS = [10 ** (4 + k / 3) for k in range(0, 25)]


@dataclass
class Histogram:
    edges_ns: list[float]
    counts: list[int]
    n: int
    p50_ns: float | None = None
    p90_ns: float | None = None
    p99_ns: float | None = None
    max_ns: float | None = None


def latency_histogram(latencies_ns: np.ndarray) -> Histogram:
    values = np.asarray(latencies_ns, dtype=np.float64)
    values = values[np.isfinite(values) & (values >= 0)]
    edges = np.asarray(LATENCY_EDGES_NS)
    counts, _ = np.histogram(np.clip(values, edges[0], edges[-1] * 0.999), bins=edges)
    if not len(values):
        return Histogram(LATENCY_EDGES_NS, counts.tolist(), 0)
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return Histogram(LATENCY_EDGES_NS, counts.tolist(), len(values), p50, p90, p99, float(values.max()))


def distance_buckets(distances: np.ndarray) -> list[tuple[str, int]]:
    """Out-of-order distances (0: in order) counted in buckets 0, 1, 2-3, 4-7, ... (powers of two)."""
    values = np.asarray(distances, dtype=np.int64)
    values = values[values >= 0]
    if not len(values):
        return []
    top = int(values.max())
    buckets = [("0 (in order)", int((values == 0).sum()))]
    low = 1
    while low <= top:
        high = low * 2 - 1
        label = str(low) if low == high else f"{low}-{high}"
        buckets.append((label, int(((values >= low) & (values <= high)).sum())))
        low *= 2
    return buckets


def scatter_peaks(x: np.ndarray, y: np.ndarray, columns: int = COLUMNS) -> tuple[np.ndarray, np.ndarray]:
    """Points reduced to the highest y per x column (all of them when they fit)."""
    x, y = np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64)
    if len(x) <= 2 * columns:
        return x, y
    x0, width = int(x.min()), max(1, int(x.max() - x.min()))
    column = np.minimum(((x - x0).astype(np.float64) * columns / width).astype(np.int64), columns - 1)
    peaks = np.full(columns, -1, np.int64)
    np.maximum.at(peaks, column, y)
    keep = peaks >= 0
    centres = x0 + ((np.arange(columns) + 0.5) * width / columns).astype(np.int64)
    return centres[keep], peaks[keep]
