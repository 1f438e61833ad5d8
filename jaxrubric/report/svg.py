"""Line charts as inline SVG, drawn here so the report needs no library and no network: series
of (round, value) points, and vertical marks at the rounds a run's watch warned."""

from __future__ import annotations

import dataclasses
import math
from html import escape

# Distinguishable on white and in grey print; a series' `colour` indexes it (cycling).
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2")
DASHES = ("", "6 3", "2 3", "8 3 2 3")
WARNING_COLOUR = "#b8860b"
# A series of more points is drawn as its line alone (with one tooltip): a dot and a tooltip
# per round of a long run would make the page megabytes of circles.
MAX_DOTS = 200


@dataclasses.dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]
    colour: int = 0
    dash: int = 0


@dataclasses.dataclass(frozen=True)
class Marker:
    """A vertical mark at round `x`; `label` is its tooltip."""

    x: float
    label: str
    colour: str = WARNING_COLOUR


@dataclasses.dataclass(frozen=True)
class Chart:
    title: str
    series: tuple[Series, ...]
    markers: tuple[Marker, ...] = ()
    note: str = ""


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def dash(index: int) -> str:
    return DASHES[index % len(DASHES)]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 times a power of ten) covering [lo, hi]."""
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    start, end = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    return [start + i * step for i in range(round((end - start) / step) + 1)]


def tick_label(value: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    text = f"{value:.{decimals}f}"
    return "0" if float(text) == 0 else text


def line_chart(chart: Chart, width: int = 520, height: int = 220) -> str:
    """The chart as an `<svg>` element: axes with round ticks, one polyline per series with a
    dot and tooltip per point (up to `MAX_DOTS`), and the markers as dashed vertical lines."""
    left, right, top, bottom = 54, 12, 10, 26
    xs = [x for s in chart.series for x, _ in s.points] + [m.x for m in chart.markers]
    ys = [y for s in chart.series for _, y in s.points]
    if not ys:
        return ""
    x_ticks = [t for t in nice_ticks(min(xs), max(xs)) if t == int(t)] or [min(xs)]
    y_ticks = nice_ticks(min(ys), max(ys))
    x0, x1 = min(x_ticks[0], min(xs)), max(x_ticks[-1], max(xs))
    y0, y1 = y_ticks[0], y_ticks[-1]
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    parts = [(f'<svg class="line-chart" width="{width}" height="{height}" '
              f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(chart.title)}">')]
    for t in y_ticks:
        parts.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{py(t):.1f}" '
                     f'y2="{py(t):.1f}"/><text class="tick" x="{left - 4}" y="{py(t) + 4:.1f}" '
                     f'text-anchor="end">{tick_label(t, y_step)}</text>')
    for t in x_ticks:
        parts.append(f'<text class="tick" x="{px(t):.1f}" y="{height - bottom + 16}" '
                     f'text-anchor="middle">{int(t)}</text>')
    parts.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" '
                 f'y2="{height - bottom}"/><line class="axis" x1="{left}" x2="{width - right}" '
                 f'y1="{height - bottom}" y2="{height - bottom}"/>')
    for m in chart.markers:
        parts.append(f'<line class="marker" x1="{px(m.x):.1f}" x2="{px(m.x):.1f}" y1="{top}" '
                     f'y2="{height - bottom}" stroke="{m.colour}" stroke-dasharray="4 3">'
                     f'<title>{escape(m.label)}</title></line>')
    for s in chart.series:
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        style = f'stroke="{colour(s.colour)}"' + (
            f' stroke-dasharray="{dash(s.dash)}"' if dash(s.dash) else "")
        tooltip = "" if len(s.points) <= MAX_DOTS else f"<title>{escape(s.label)}</title>"
        parts.append(f'<g class="series" data-series="{escape(s.label)}">'
                     f'<polyline fill="none" stroke-width="1.8" {style} points="{points}">'
                     f"{tooltip}</polyline>")
        for x, y in s.points if len(s.points) <= MAX_DOTS else ():
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.4" '
                         f'fill="{colour(s.colour)}"><title>{escape(s.label)}, round '
                         f'{int(x)}: {y:.4g}</title></circle>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)
