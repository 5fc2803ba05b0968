"""The report's pictures, one function each: lake rows in, an inline SVG string out.

Each reads only what it draws (one channel incarnation's deliveries, one message's deliveries,
one column of latencies), so the pictures of a lake of millions of rows cost a few columns of
memory, and each reduces what it draws to a bounded number of points (series.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import schema
from . import series as S
from .lake_view import LakeView, column_values, incarnation_rows, message_deliveries
from .words import clock, place_name
from .svg import BLUE, GREEN, GREY, ORANGE, PURPLE, RED, Plot, duration, nice_ticks, number, time_unit

SEVERITY_COLOUR = {"critical": RED, "warning": ORANGE, "info": BLUE}
MAX_MARKS = 200  # lost/nacked marks on one chart
MAX_EXACT_ROWS = 2_000_000  # above this, a channel's time charts come from channel_metrics
INK_MARK = "#3e4c59"
DECADE_LABELS = ("10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s", "100 s", "1000 s")  # LATENCY_EDGES_NS
Key = tuple[str, int, int]  # a channel incarnation: (connection_id, channel, incarnation)


def _time_ticks(t0_ns: int, t1_ns: int) -> tuple[list[tuple[float, str]], str]:
    per_unit, unit = time_unit(t1_ns - t0_ns)
    ticks = nice_ticks(0, (t1_ns - t0_ns) / per_unit, 6)
    return [(t0_ns + t * per_unit, number(t)) for t in ticks if t0_ns + t * per_unit <= t1_ns], unit


def _time_label(t0_ns: int, unit: str) -> str:
    return f"{unit} since {clock(t0_ns)}"


def _finding_bands(plot: Plot, view: LakeView, key: Key) -> None:
    """Shade the spans of the findings on this incarnation, in their severity's colour."""
    seen = set()
    for f in view.findings:
        if (f["connection_id"], f["channel"], f["incarnation"]) != key or f["first_ts_ns"] is None:
            continue
        x0, x1 = plot.px(max(plot.x0, f["first_ts_ns"])), plot.px(min(plot.x1, f["last_ts_ns"] or f["first_ts_ns"]))
        colour = SEVERITY_COLOUR.get(f["severity"], GREY)
        plot.parts.insert(0, f'<rect x="{x0:.1f}" y="{plot.top}" width="{max(2.0, x1 - x0):.1f}" '
                             f'height="{plot.plot_height}" fill="{colour}" fill-opacity="0.08"/>')
        if f["kind"] not in seen:
            seen.add(f["kind"])
            plot.legend.append((f"span of {f['kind']}", colour, "box-light"))


def _end_of(view: LakeView, key: Key, last_event_ns: int) -> int:
    for ch in view.channels:
        if (ch["connection_id"], ch["channel"], ch["incarnation"]) == key:
            return max(last_event_ns, ch["end_ts_ns"] or ch["observed_until_ts_ns"] or last_event_ns)
    return last_event_ns


def unacked_events(view: LakeView, key: Key) -> pa.Table:
    """The deliveries that count as unacked while outstanding (channel_metrics' rule: manual ack,
    outcome known), in time order: ts_ns, settle_ts_ns (null: never settled) and the prefetch."""
    rows = incarnation_rows(view.lake_dir, "deliveries", schema.DELIVERIES,
                            ["ts_ns", "settle_ts_ns", "no_ack", "outcome", "consumer_prefetch", "channel_prefetch",
                             "consumer_tag"], key).sort_by("ts_ns")
    return rows.filter(pc.and_(pc.equal(rows["no_ack"], False), pc.not_equal(rows["outcome"], "unknown")))


def unconfirmed_events(view: LakeView, key: Key) -> pa.Table:
    """The publishes that count as unconfirmed while outstanding (confirm mode, outcome known)."""
    rows = incarnation_rows(view.lake_dir, "publishes", schema.PUBLISHES,
                            ["ts_ns", "settle_ts_ns", "mode", "outcome"], key).sort_by("ts_ns")
    return rows.filter(pc.and_(pc.equal(rows["mode"], "confirm"), pc.not_equal(rows["outcome"], "unknown")))


def outstanding_series(view: LakeView, key: Key, events: pa.Table, columns: int = S.COLUMNS) -> S.StepSeries:
    starts = events["ts_ns"].to_numpy()
    settles = events["settle_ts_ns"].fill_null(-1).to_numpy()
    return S.outstanding(starts, settles, _end_of(view, key, int(max(starts.max(), settles.max()))), columns)


@dataclass
class Outstanding:
    """What a time chart draws for one incarnation, from whichever source suits its size."""
    line: S.StepSeries
    t0: int
    consumer_limits: list[tuple[int, int]] = field(default_factory=list)  # (since, prefetch) changes
    channel_limits: list[tuple[int, int]] = field(default_factory=list)
    consumers: int = 0
    marks: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # what -> (times, counts)
    bucket_seconds: int | None = None  # set when drawn from channel_metrics


def _from_metrics(view: LakeView, key: Key, busy_column: str) -> bool:
    """channel_metrics (one row per bucket) when the timeline rows are too many to read, or the
    buckets alone already give a point per pixel; else the exact timeline."""
    rows = next((c[busy_column] or 0 for c in view.channels if _channel_key(c) == key), 0)
    bucket_ns = view.bucket_seconds * 1e9
    span = next(((c["end_ts_ns"] or c["observed_until_ts_ns"] or c["open_ts_ns"] or 0) - (c["open_ts_ns"] or 0)
                 for c in view.channels if _channel_key(c) == key), 0)
    return view.has_channel_metrics and (rows > MAX_EXACT_ROWS or span / bucket_ns >= S.COLUMNS)


def _channel_key(row: dict) -> Key:
    return row["connection_id"], row["channel"], row["incarnation"]


def unacked_source(view: LakeView, key: Key) -> Outstanding | None:
    if _from_metrics(view, key, "deliveries"):
        return _metrics_source(view, key, "unacked")
    counted = unacked_events(view, key)
    if counted.num_rows == 0:
        return None
    times = counted["ts_ns"].to_numpy()
    return Outstanding(
        outstanding_series(view, key, counted), int(times.min()),
        S.changes(times, np.array(counted["consumer_prefetch"].to_pylist(), object)),
        S.changes(times, np.array(counted["channel_prefetch"].to_pylist(), object)),
        len(set(counted["consumer_tag"].drop_null().to_pylist())))


def unconfirmed_source(view: LakeView, key: Key) -> Outstanding | None:
    if _from_metrics(view, key, "publishes"):
        return _metrics_source(view, key, "unconfirmed")
    counted = unconfirmed_events(view, key)
    if counted.num_rows == 0:
        return None
    marks = {what: np.unique(counted.filter(pc.equal(counted["outcome"], outcome))["settle_ts_ns"].drop_null()
                             .to_numpy(), return_counts=True)
             for outcome, what in (("lost", "lost"), ("nacked", "nacked by the broker"))}
    return Outstanding(outstanding_series(view, key, counted), int(counted["ts_ns"].to_numpy().min()), marks=marks)


def _metrics_source(view: LakeView, key: Key, what: str) -> Outstanding | None:
    """The bucket rows of channel_metrics as a step series of each bucket's peak. Buckets are rows
    only where something happened or was outstanding: after a bucket with no successor the count
    falls to what it was at that bucket's end (nothing outstanding, or the end of the data)."""
    rows = incarnation_rows(view.lake_dir, "channel_metrics", schema.CHANNEL_METRICS,
                            ["bucket_start_ns", "bucket_seconds", "as_of_ns", what, f"{what}_max", "consumer_prefetch",
                             "channel_prefetch", "lost", "confirm_nacks"], key).sort_by("bucket_start_ns")
    if rows.num_rows == 0 or not pc.max(rows[f"{what}_max"]).as_py():
        return None
    starts, ends = rows["bucket_start_ns"].to_numpy(), rows["as_of_ns"].to_numpy()
    peaks, at_end = rows[f"{what}_max"].to_numpy(), rows[what].to_numpy()
    lengths = rows["bucket_seconds"].to_numpy().astype(np.int64) * 1_000_000_000
    gap_after = np.append(starts[1:] != starts[:-1] + lengths[:-1], True)
    times = np.concatenate([starts, ends[gap_after]])
    values = np.concatenate([peaks, at_end[gap_after]])
    order = np.argsort(times, kind="stable")
    line = S.reduce_to_columns(S.StepSeries(times[order], values[order], int(ends.max()), peak_per_column=True))
    source = Outstanding(line, int(starts.min()), bucket_seconds=int(rows["bucket_seconds"][0].as_py()))
    if what == "unacked":
        source.consumer_limits = S.changes(starts, np.array(rows["consumer_prefetch"].to_pylist(), object))
        source.channel_limits = S.changes(starts, np.array(rows["channel_prefetch"].to_pylist(), object))
    else:
        for column, label in (("lost", "lost"), ("confirm_nacks", "nacked by the broker")):
            counts = rows[column].fill_null(0).to_numpy()
            source.marks[label] = (starts[counts > 0], counts[counts > 0])  # at their bucket's start
    return source


def _line_label(name: str, source: Outstanding) -> str:
    if source.bucket_seconds:
        return f"{name} (peak per {source.bucket_seconds} s bucket, channel_metrics)"
    return name + (" (peak per pixel)" if source.line.peak_per_column else "")


def unacked_chart(view: LakeView, key: Key, title: str) -> str | None:
    """Manual-ack deliveries unacked over time, against the prefetch limits in force."""
    source = unacked_source(view, key)
    if source is None:
        return None
    line, t0, end_ns = source.line, source.t0, source.line.end_ns
    limits = [v for _, v in source.consumer_limits + source.channel_limits if v]
    top = max([line.peak] + limits) * 1.12 + 1
    plot = Plot(title, (t0, end_ns), (0, top))
    ticks, unit = _time_ticks(t0, end_ns)
    plot.count_axis(_time_label(t0, unit), "deliveries unacked", ticks)
    _finding_bands(plot, view, key)
    for changes, colour, what in ((source.consumer_limits, ORANGE, "prefetch per consumer"),
                                  (source.channel_limits, RED, "channel prefetch (global)")):
        if any(v for _, v in changes):
            latest = changes[-1][1]
            label = f"{what}: {latest or 'unlimited'}" + (
                f" ({source.consumers} consumers)" if source.consumers > 1 and what.endswith("consumer") else "")
            plot.step([(t, v if v else top) for t, v in changes], end_ns, colour, label, dash="6 4", width=1.6)
    if not limits:
        plot.legend.append(("no prefetch limit (basic.qos 0 or none)", RED, "dash"))
    plot.step(list(zip(line.times_ns.tolist(), line.values.tolist())), end_ns, PURPLE,
              _line_label("unacked", source), fill=True)
    plot.legend.append((f"peak {line.peak:,} unacked", PURPLE, "none"))
    return plot.render()


def unconfirmed_chart(view: LakeView, key: Key, title: str) -> str | None:
    """Confirm-mode publishes awaiting their confirm over time; the lost ones marked where they were lost."""
    source = unconfirmed_source(view, key)
    if source is None:
        return None
    line, t0, end_ns = source.line, source.t0, source.line.end_ns
    plot = Plot(title, (t0, end_ns), (0, line.peak * 1.12 + 1))
    ticks, unit = _time_ticks(t0, end_ns)
    plot.count_axis(_time_label(t0, unit), "publishes unconfirmed", ticks)
    _finding_bands(plot, view, key)
    plot.step(list(zip(line.times_ns.tolist(), line.values.tolist())), end_ns, BLUE,
              _line_label("unconfirmed", source), fill=True)
    colours = {"lost": RED, "nacked by the broker": ORANGE}
    for what, (at, counts) in source.marks.items():
        if len(at):
            # At most MAX_MARKS marks: losses close together share one.
            step = max(1, (end_ns - t0) // MAX_MARKS)
            instants, slot = np.unique(t0 + (at - t0) // step * step, return_inverse=True)
            for t, n in zip(instants.tolist(), np.bincount(slot, weights=counts).astype(np.int64).tolist()):
                plot.marker(t, line.value_at(t), colours[what], "cross",
                            f"{n:,} publishes {what} at +{duration(t - t0)}")
            plot.legend.append((f"{int(counts.sum()):,} {what}", colours[what], "cross"))
    plot.legend.append((f"peak {line.peak:,} unconfirmed", BLUE, "none"))
    return plot.render()


def latency_chart(histogram: S.Histogram, title: str, what: str, colour: str) -> str | None:
    """A log-binned latency histogram with its percentiles."""
    if not histogram.n:
        return None
    slots = len(histogram.counts)
    plot = Plot(title, (0, slots), (0, max(histogram.counts) * 1.12 + 1))
    labels = [(x, ("≤" if x == 0 else "≥" if x == slots else "") + DECADE_LABELS[x // 3])
              for x in range(0, slots + 1, 3)]
    plot.count_axis(f"{what} latency (log scale, bins of a third of a decade)", "count", labels)
    titles = [f"{duration(histogram.edges_ns[i])} – {duration(histogram.edges_ns[i + 1])}: {c:,}"
              for i, c in enumerate(histogram.counts)]
    plot.bars([float(c) for c in histogram.counts], colour, f"{histogram.n:,} {what}s", titles)
    for value, name, line_colour in ((histogram.p50_ns, "p50", INK_MARK), (histogram.p99_ns, "p99", RED)):
        x = _log_slot(histogram, value)
        plot.parts.append(f'<line x1="{plot.px(x):.1f}" y1="{plot.top}" x2="{plot.px(x):.1f}" '
                          f'y2="{plot.top + plot.plot_height}" stroke="{line_colour}" stroke-width="1.5" '
                          f'stroke-dasharray="4 3"/>')
        plot.legend.append((f"{name} {duration(value)}", line_colour, "dash"))
    plot.legend.append((f"max {duration(histogram.max_ns)}", GREY, "none"))
    return plot.render()



def _log_slot(histogram: S.Histogram, value_ns: float) -> float:
    """Where a latency falls on the histogram's slot axis (slots are equal steps of log10)."""
    first, last = math.log10(histogram.edges_ns[0]), math.log10(histogram.edges_ns[-1])
    position = (math.log10(max(value_ns, 1.0)) - first) / (last - first)
    return min(max(position, 0.0), 1.0) * len(histogram.counts)


def confirm_latency(view: LakeView) -> S.Histogram:
    values = column_values(view.lake_dir, "publishes", schema.PUBLISHES, "settle_latency_ns",
                           pc.field("outcome").isin(["acked", "nacked"]))
    return S.latency_histogram(values.drop_null().to_numpy())


def ack_latency(view: LakeView) -> S.Histogram:
    values = column_values(view.lake_dir, "deliveries", schema.DELIVERIES, "settle_latency_ns",
                           (pc.field("outcome") == "ack") & (pc.field("no_ack") == False))  # noqa: E712
    return S.latency_histogram(values.drop_null().to_numpy())


def out_of_order_chart(view: LakeView) -> tuple[str | None, int, int]:
    """How far confirms came out of publish order, over every confirmed publish: (svg, out of order, all)."""
    values = column_values(view.lake_dir, "publishes", schema.PUBLISHES, "out_of_order_by",
                           pc.field("outcome").isin(["acked", "nacked"])).drop_null().to_numpy()
    buckets = S.distance_buckets(values)
    if not buckets:
        return None, 0, 0
    out_of_order = int((values > 0).sum())
    slots = max(len(buckets), 6)  # a lone bucket stays a bar, not a wall
    plot = Plot("Publish-to-confirm order", (0, slots), (0, max(n for _, n in buckets) * 1.18 + 1))
    plot.count_axis("out-of-order distance: confirm number minus the oldest still unconfirmed",
                    "confirmed publishes", [(i + 0.5, label) for i, (label, _) in enumerate(buckets)])
    titles = [f"distance {label}: {n:,}" for label, n in buckets]
    plot.bars([float(buckets[0][1])], GREEN, "confirmed in order", titles, numbers=True)
    plot.bars([0.0] + [float(n) for _, n in buckets[1:]], ORANGE, "confirmed out of order", titles, numbers=True)
    return plot.render(), out_of_order, len(values)


def out_of_order_scatter(view: LakeView, key: Key, title: str) -> str | None:
    """One channel's confirms: publish number against how far out of order its confirm came."""
    rows = incarnation_rows(view.lake_dir, "publishes", schema.PUBLISHES,
                            ["confirm_seq", "out_of_order_by", "outcome"], key)
    rows = rows.filter(pc.and_(pc.is_valid(rows["confirm_seq"]), pc.is_valid(rows["out_of_order_by"])))
    if rows.num_rows == 0:
        return None
    x, y = S.scatter_peaks(rows["confirm_seq"].to_numpy(), rows["out_of_order_by"].to_numpy())
    plot = Plot(title, (max(0, int(x.min()) - 1), int(x.max()) + 1), (0, int(y.max()) * 1.12 + 1), height=220)
    xt = [(t, number(t)) for t in nice_ticks(plot.x0, plot.x1, 8) if t == int(t) and plot.x0 <= t <= plot.x1]
    plot.count_axis("publish number (confirm_seq)", "distance", xt)
    for xi, yi in zip(x.tolist(), y.tolist()):
        plot.parts.append(f'<circle cx="{plot.px(xi):.1f}" cy="{plot.py(yi):.1f}" r="2.6" '
                          f'fill="{ORANGE if yi else GREEN}"/>')
    plot.legend = [("in order", GREEN, "circle"), ("out of order", ORANGE, "circle")]
    return plot.render()


OUTCOME_STYLE = {  # outcome -> (colour, shape, words)
    "ack": (GREEN, "circle", "acked"),
    "auto": (GREEN, "circle", "auto-ack"),
    "nack": (RED, "cross", "nacked"),
    "reject": (RED, "cross", "rejected"),
    "channel_closed": (ORANGE, "square", "channel closed first"),
    "connection_closed": (ORANGE, "square", "connection closed first"),
    "recovered": (ORANGE, "square", "basic.recover"),
    "open": (PURPLE, "square", "still unacked at the end"),
    "unknown": (GREY, "square", "unknown"),
}


def requeue_loop_chart(view: LakeView, finding: dict, limit: int = 200) -> tuple[str | None, int, int]:
    """The deliveries of one looping message: when, on which consumer's channel, and how each ended.
    (svg, deliveries drawn, deliveries in all)."""
    rows, total = message_deliveries(view.lake_dir, finding["message_identity"], limit)
    if not rows:
        return None, 0, 0
    places = sorted({(r["connection_id"], r["channel"], r["incarnation"]) for r in rows},
                    key=lambda k: min(r["ts_ns"] for r in rows if (r["connection_id"], r["channel"], r["incarnation"]) == k))
    lane = {k: i for i, k in enumerate(places)}
    t0, t1 = rows[0]["ts_ns"], max(r["settle_ts_ns"] or r["ts_ns"] for r in rows)
    height = 90 + 34 * len(places)
    names = [place_name(view, k) for k in places]
    left = min(300, max(90, 7 * max(len(n) for n in names) + 16))
    pad = max(1, (t1 - t0) // 40)
    plot = Plot(f"Deliveries of message {finding['message_identity']}", (t0 - pad, max(t1, t0 + 1) + pad),
                (-0.6, len(places) - 0.4), height=height, left=left)
    ticks, unit = _time_ticks(t0, max(t1, t0 + 1))
    plot.axes(_time_label(t0, unit), "", ticks, [(i, n) for i, n in enumerate(names)])
    plot.polyline([(r["ts_ns"], lane[(r["connection_id"], r["channel"], r["incarnation"])]) for r in rows], GREY)
    used = {}
    for i, r in enumerate(rows, 1):
        colour, shape, words = OUTCOME_STYLE.get(r["outcome"], (GREY, "square", r["outcome"] or "?"))
        if r["outcome"] in ("nack", "reject") and r["requeue"] is False:
            colour, words = PURPLE, words + " (not requeued)"
        elif r["outcome"] in ("nack", "reject"):
            words += " and requeued"
        used.setdefault(words, (colour, shape))
        tip = (f"delivery {i}: tag {r['delivery_tag']}, {words}" + (", redelivered" if r["redelivered"] else "")
               + (f", x-death {r['x_death_count']}" if r["x_death_count"] else "")
               + (f", consumer {r['consumer_tag']}" if r["consumer_tag"] else "")
               + (f", queue {r['queue']}" if r["queue"] else ""))
        plot.marker(r["ts_ns"], lane[(r["connection_id"], r["channel"], r["incarnation"])], colour, shape, tip)
    plot.legend = [(words, colour, shape) for words, (colour, shape) in used.items()]
    return plot.render(), len(rows), total
