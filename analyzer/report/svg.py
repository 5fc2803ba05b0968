"""A small inline-SVG plotting kit: a plot area with labelled axes, ticks on round numbers, step
lines, bars, markers and a legend. No library and no script: the report must open offline and
stay readable with JavaScript off. Every text drawn is escaped here, once.
"""

from __future__ import annotations

import math
from html import escape

# Colours: one per role, reused by every chart so a colour means the same thing everywhere.
INK, MUTED, GRID = "#1f2933", "#616e7c", "#e4e7eb"
BLUE, ORANGE, GREEN, RED, PURPLE, GREY = "#1d6fb8", "#e07b00", "#2e8540", "#c62828", "#7b3fa0", "#9aa5b1"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 times a power of ten) covering [low, high]."""
    if high <= low:
        high = low + 1
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def number(value: float) -> str:
    """A tick label: no trailing zeros, thousands separated."""
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.6f}".rstrip("0").rstrip(".")


def time_unit(span_ns: float) -> tuple[float, str]:
    """(nanoseconds per unit, unit name) that keep a time axis's labels short."""
    seconds = span_ns / 1e9
    if seconds < 2:
        return 1e6, "ms"
    if seconds < 180:
        return 1e9, "s"
    if seconds < 3 * 3600:
        return 60e9, "min"
    return 3600e9, "h"


def duration(ns: float | None) -> str:
    """A latency or age for people: 840 µs, 12.3 ms, 2.05 s, 3.5 min."""
    if ns is None:
        return "–"
    if ns < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.3g} ms"
    if ns < 120e9:
        return f"{ns / 1e9:.3g} s"
    if ns < 7200e9:
        return f"{ns / 60e9:.3g} min"
    return f"{ns / 3600e9:.3g} h"


class Plot:
    """One chart: a plot area inside margins, data coordinates mapped onto it."""

    def __init__(self, title: str, x_range: tuple[float, float], y_range: tuple[float, float],
                 width: int = 1030, height: int = 240, left: int = 80, right: int = 36, top: int = 34,
                 bottom: int = 46):
        self.title, self.width, self.height = title, width, height
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1
        self.parts: list[str] = []
        self.legend: list[tuple[str, str, str]] = []  # (label, colour, style)

    @property
    def plot_width(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> int:
        return self.height - self.top - self.bottom

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.plot_width

    def py(self, y: float) -> float:
        return self.top + self.plot_height - (y - self.y0) / (self.y1 - self.y0) * self.plot_height

    def axes(self, x_label: str, y_label: str, x_ticks: list[tuple[float, str]],
             y_ticks: list[tuple[float, str]]) -> None:
        bottom, right = self.top + self.plot_height, self.left + self.plot_width
        for y, label in y_ticks:
            py = self.py(y)
            self.parts.append(f'<line x1="{self.left}" y1="{py:.1f}" x2="{right}" y2="{py:.1f}" stroke="{GRID}"/>')
            self.parts.append(f'<text x="{self.left - 6}" y="{py + 4:.1f}" text-anchor="end" '
                              f'class="tick">{escape(label)}</text>')
        for x, label in x_ticks:
            px = self.px(x)
            self.parts.append(f'<line x1="{px:.1f}" y1="{bottom}" x2="{px:.1f}" y2="{bottom + 4}" stroke="{MUTED}"/>')
            self.parts.append(f'<text x="{px:.1f}" y="{bottom + 17}" text-anchor="middle" '
                              f'class="tick">{escape(label)}</text>')
        self.parts.append(f'<line x1="{self.left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="{MUTED}"/>')
        self.parts.append(f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{bottom}" stroke="{MUTED}"/>')
        self.parts.append(f'<text x="{self.left + self.plot_width / 2:.1f}" y="{self.height - 6}" '
                          f'text-anchor="middle" class="axis">{escape(x_label)}</text>')
        self.parts.append(f'<text transform="translate(14 {self.top + self.plot_height / 2:.1f}) rotate(-90)" '
                          f'text-anchor="middle" class="axis">{escape(y_label)}</text>')

    def count_axis(self, x_label: str, y_label: str, x_ticks: list[tuple[float, str]]) -> None:
        """Axes whose y is a count starting at 0."""
        ticks = [t for t in nice_ticks(self.y0, self.y1) if t == int(t)] or [0]
        self.axes(x_label, y_label, x_ticks, [(t, number(t)) for t in ticks])

    def step(self, points: list[tuple[float, float]], end_x: float, colour: str, label: str,
             dash: str = "", width: float = 1.8, fill: bool = False) -> None:
        if not points:
            return
        path = [f"M{self.px(points[0][0]):.1f},{self.py(points[0][1]):.1f}"]
        for (x, y), (next_x, _) in zip(points, points[1:] + [(end_x, None)]):
            path.append(f"H{self.px(next_x):.1f}")
            if _ is not None:
                path.append(f"V{self.py(_):.1f}")
        d = "".join(path)
        if fill:
            base = self.py(max(self.y0, 0))
            area = (f"M{self.px(points[0][0]):.1f},{base:.1f}" + "L" + d[1:]
                    + f"V{base:.1f}Z")
            self.parts.append(f'<path d="{area}" fill="{colour}" fill-opacity="0.15" stroke="none"/>')
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width}"{dashed}/>')
        self.legend.append((label, colour, "dash" if dash else "line"))

    def hline(self, y: float, colour: str, label: str, dash: str = "6 4") -> None:
        py = self.py(y)
        self.parts.append(f'<line x1="{self.left}" y1="{py:.1f}" x2="{self.left + self.plot_width}" '
                          f'y2="{py:.1f}" stroke="{colour}" stroke-width="1.6" stroke-dasharray="{dash}"/>')
        self.legend.append((label, colour, "dash"))

    def bars(self, values: list[float], colour: str, label: str, titles: list[str] | None = None,
             numbers: bool = False) -> None:
        """One bar per slot 0..n-1 on an x range of (0, n); `numbers` writes each bar's value above it
        (small bars beside a tall one would otherwise read as nothing)."""
        for i, value in enumerate(values):
            if value <= 0:
                continue
            x, y = self.px(i) + 1, self.py(value)
            w = max(1.0, self.px(i + 1) - self.px(i) - 2)
            tip = f"<title>{escape(titles[i])}</title>" if titles else ""
            self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
                              f'height="{self.py(self.y0) - y:.1f}" fill="{colour}">{tip}</rect>')
            if numbers:
                self.text(x + w / 2, y - 4, number(value), "middle", "note")
        self.legend.append((label, colour, "box"))

    def marker(self, x: float, y: float, colour: str, shape: str = "circle", tip: str = "") -> None:
        px, py = self.px(x), self.py(y)
        title = f"<title>{escape(tip)}</title>" if tip else ""
        if shape == "cross":
            self.parts.append(f'<path d="M{px - 5:.1f},{py - 5:.1f}L{px + 5:.1f},{py + 5:.1f}M{px - 5:.1f},'
                              f'{py + 5:.1f}L{px + 5:.1f},{py - 5:.1f}" stroke="{colour}" stroke-width="2.4">'
                              f'{title}</path>')
        elif shape == "square":
            self.parts.append(f'<rect x="{px - 5:.1f}" y="{py - 5:.1f}" width="10" height="10" fill="{colour}">'
                              f'{title}</rect>')
        else:
            self.parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="5" fill="{colour}">{title}</circle>')

    def polyline(self, points: list[tuple[float, float]], colour: str) -> None:
        if len(points) > 1:
            coords = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in points)
            self.parts.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1" '
                              f'stroke-opacity="0.6"/>')

    def text(self, x: float, y: float, label: str, anchor: str = "start", css: str = "tick") -> None:
        """Text at pixel (not data) coordinates."""
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{css}">{escape(label)}</text>')

    def render(self, legend: list[tuple[str, str, str]] | None = None) -> str:
        entries = self.legend if legend is None else legend
        key, x = [], self.left
        for label, colour, style in entries:
            if style in ("box", "box-light"):
                opacity = ' fill-opacity="0.3"' if style == "box-light" else ""
                key.append(f'<rect x="{x}" y="12" width="12" height="10" fill="{colour}"{opacity}/>')
            elif style == "none":
                x -= 22
            elif style == "circle":
                key.append(f'<circle cx="{x + 6}" cy="17" r="5" fill="{colour}"/>')
            elif style == "cross":
                key.append(f'<path d="M{x + 1},12L{x + 11},22M{x + 1},22L{x + 11},12" stroke="{colour}" '
                           f'stroke-width="2.4"/>')
            else:
                dash = ' stroke-dasharray="5 3"' if style == "dash" else ""
                key.append(f'<line x1="{x}" y1="17" x2="{x + 18}" y2="17" stroke="{colour}" stroke-width="2.4"{dash}/>')
            key.append(f'<text x="{x + 22}" y="21" class="legend">{escape(label)}</text>')
            x += 34 + 7 * len(label)
        return (f'<svg class="chart" role="img" viewBox="0 0 {self.width} {self.height}" width="{self.width}" '
                f'height="{self.height}" xmlns="http://www.w3.org/2000/svg"><title>{escape(self.title)}</title>'
                + "".join(key) + "".join(self.parts) + "</svg>")
