"""Inline SVG for the reports (self-contained, no scripts): the pieces every plot shares — a log scale in
decades, the plot frame with its labelled grid — and the plots built on them.

* ``divergence_svg``: the per-node divergence along the topological order. One bar per node in topological
  order; its height is log10 of the node's greatest absolute difference (identical nodes get no bar). The first
  diverging node is marked with a vertical line and origin nodes with orange diamonds, so the reader sees where
  the difference is born and how it grows downstream.
* ``status_strip_svg``: a model's nights at a glance (history page): one row per GPU type, one cell per night
  coloured by its status, a black diamond where the quantized model's md5 changed.
* ``trend_svg``: one figure over the nights (history page): one line per model and GPU type, on a log scale
  (differences), a share (accuracy, agreement) or a count; failed nights ringed in red, md5 changes as diamonds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Callable, Iterable, Sequence

# Colours the screenshot tests look for.
BAR_COLOUR = "#1565c0"
ORIGIN_COLOUR = "#ef6c00"
FIRST_COLOUR = "#c62828"
STATUS_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "error": "#6a1b9a", "running": "#90a4ae", "none": "#eceff1"}
MARK_COLOUR = "#212121"
# one colour per line of a trend plot (none of them the pass green or the fail red)
SERIES_COLOURS = ("#1565c0", "#ef6c00", "#00838f", "#ad1457", "#6d4c41", "#827717", "#283593", "#546e7a", "#9e9d24", "#4e342e")


# --- shared pieces --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LogScale:
    """Decades ``1e{low}`` .. ``1e{high}`` covering the finite positive values of a plot."""

    low: int
    high: int

    @classmethod
    def covering(cls, values: Iterable[float], default: tuple[int, int] = (-8, 0)) -> "LogScale":
        finite = [v for v in values if v > 0 and math.isfinite(v)]
        low = math.floor(math.log10(min(finite))) if finite else default[0]
        high = math.ceil(math.log10(max(finite))) if finite else default[1]
        return cls(low, high if high > low else low + 1)

    def position(self, value: float) -> float:
        """Where ``value`` lies between the lowest (0) and the highest decade (1); 0 for 0 or less, 1 for +inf."""
        if math.isinf(value) and value > 0:
            return 1.0
        if not value > 0 or not math.isfinite(value):
            return 0.0
        return min(1.0, max(0.0, (math.log10(value) - self.low) / (self.high - self.low)))

    def ticks(self) -> list[tuple[float, str]]:
        return [((e - self.low) / (self.high - self.low), f"1e{e}") for e in range(self.low, self.high + 1)]


@dataclass(frozen=True)
class Frame:
    """A plot's box inside an SVG of ``width`` × ``height``: margins, and the y of a position (0 bottom, 1 top)."""

    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    def y(self, position: float) -> float:
        return self.top + self.plot_h - position * self.plot_h

    def open(self, css: str, label: str, attributes: str = "") -> str:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" class="{css}" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}" role="img" aria-label="{escape(label)}"{attributes}>')

    def box(self) -> str:
        return f'<rect x="{self.left}" y="{self.top}" width="{self.plot_w:.1f}" height="{self.plot_h:.1f}" fill="#fafafa" stroke="#bbb"/>'

    def grid(self, ticks: Iterable[tuple[float, str]]) -> list[str]:
        """A horizontal line and its label at each (position, label)."""
        parts = []
        for position, text in ticks:
            y = self.y(position)
            parts.append(f'<line x1="{self.left}" x2="{self.left + self.plot_w:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>')
            parts.append(f'<text x="{self.left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#555">{escape(text)}</text>')
        return parts


def diamond(cx: float, cy: float, r: float, fill: str, css: str, title: str, stroke: str = "") -> str:
    outline = f' stroke="{stroke}" stroke-width="1.5"' if stroke else ""
    return (f'<path class="{css}" d="M{cx:.1f},{cy - r:.1f} L{cx + r:.1f},{cy:.1f} L{cx:.1f},{cy + r:.1f} L{cx - r:.1f},{cy:.1f} Z" '
            f'fill="{fill}"{outline}><title>{escape(title)}</title></path>')


# --- the per-node divergence ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodePoint:
    """One node of the plot: its name, greatest absolute difference (0 = identical) and role."""

    name: str
    max_abs_diff: float
    origin: bool = False
    mismatched_fraction: float = 0.0
    exact: bool = True  # False: a lower bound (the fingerprints' min, max and mean), drawn hatched


def divergence_svg(points: list[NodePoint], first: str | None, width: int = 960, height: int = 260) -> str:
    """The divergence plot as an ``<svg>`` element (self-contained, no scripts)."""
    if not points:
        return '<p class="muted">No per-node comparison in this report.</p>'
    frame = Frame(width, height, left=56, right=12, top=14, bottom=40)
    scale = LogScale.covering(p.max_abs_diff for p in points)
    step = frame.plot_w / len(points)
    parts = [frame.open("divergence", "per-node divergence"), frame.box(), *frame.grid(scale.ticks())]
    if not all(p.exact for p in points):
        parts.append(f'<defs><pattern id="lower-bound" width="4" height="4" patternUnits="userSpaceOnUse" '
                     f'patternTransform="rotate(45)"><rect width="4" height="4" fill="#fff"/>'
                     f'<rect width="2" height="4" fill="{BAR_COLOUR}"/></pattern></defs>')
    bar_w = max(1.0, step * 0.8)
    for index, point in enumerate(points):
        if not point.max_abs_diff > 0:  # identical (0) or not a number: no bar
            continue
        h = max(0.04, scale.position(point.max_abs_diff)) * frame.plot_h  # the smallest difference stays visible
        x = frame.left + index * step
        bound = "" if point.exact else "≥ "
        title = escape(f"{index}: {point.name} max abs diff {bound}{point.max_abs_diff:.3g}"
                       + ("" if point.exact else " (lower bound from the fingerprints)"))
        fill = BAR_COLOUR if point.exact else "url(#lower-bound)"
        parts.append(
            f'<rect class="bar{"" if point.exact else " lower-bound"}" x="{x:.2f}" y="{frame.top + frame.plot_h - h:.2f}" '
            f'width="{bar_w:.2f}" height="{h:.2f}" fill="{fill}" stroke="{BAR_COLOUR}" stroke-width="0.5">'
            f'<title>{title}</title></rect>'
        )
    for index, point in enumerate(points):
        if point.origin:
            cx, cy = frame.left + (index + 0.5) * step, frame.top + frame.plot_h + 10
            parts.append(diamond(cx, cy, 7, ORIGIN_COLOUR, "origin", "origin: " + point.name))
    names = [p.name for p in points]
    if first in names:
        x = frame.left + (names.index(first) + 0.5) * step
        parts.append(f'<line class="first" x1="{x:.1f}" x2="{x:.1f}" y1="{frame.top}" y2="{frame.top + frame.plot_h}" stroke="{FIRST_COLOUR}" stroke-width="2" stroke-dasharray="5,3"/>')
        anchor = "start" if x < frame.left + frame.plot_w * 0.7 else "end"
        dx = 5 if anchor == "start" else -5
        parts.append(f'<text x="{x + dx:.1f}" y="{frame.top + 14}" font-size="12" fill="{FIRST_COLOUR}" text-anchor="{anchor}">first diverging: {escape(first)}</text>')
    parts.append(f'<text x="{frame.left + frame.plot_w / 2:.1f}" y="{height - 4}" font-size="12" text-anchor="middle" fill="#333">'
                 f'{len(points)} nodes in topological order → (bar: greatest |difference|, log scale; hatched: a lower '
                 f'bound; ◆ origin node)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


# --- nights: the history page ---------------------------------------------------------------------------------

NIGHTS_LEFT, NIGHTS_RIGHT, NIGHTS_WIDTH = 170, 16, 1000  # every night plot shares its x axis: nights line up


def _filter_attributes(attributes: dict[str, str]) -> str:
    return "".join(f' {name}="{escape(value)}"' for name, value in attributes.items())


def _night_x(frame: Frame, count: int, column: int) -> float:
    return frame.left + (column + 0.5) * frame.plot_w / max(count, 1)


def date_labels(stamps: Sequence[str], shown: Sequence[int]) -> dict[int, str]:
    """The labels of the nights ``shown`` (``stamps``: when each night started, ISO UTC): the day (``11-26``), and
    the time as well (``11-26 03:10``) where several nights shown share a day, so that no two ticks read alike."""
    days = [stamps[i][5:10] for i in shown]
    labels = {}
    for index, day in zip(shown, days):
        clock = stamps[index][11:16]
        labels[index] = f"{day} {clock}" if days.count(day) > 1 and clock else day
    return labels


def _date_axis(frame: Frame, dates: Sequence[str], y: float) -> list[str]:
    """Date labels under the nights (``dates``: when each started): at most about a dozen, always the last
    night's, each distinct (``date_labels``)."""
    step = max(1, math.ceil(len(dates) / 12))
    shown = [i for i in range(len(dates)) if i % step == 0]
    if dates and shown[-1] != len(dates) - 1:
        if len(dates) - 1 - shown[-1] < step / 2:
            shown.pop()
        shown.append(len(dates) - 1)
    parts = []
    labels = date_labels(dates, shown)
    for index in shown:
        x = _night_x(frame, len(dates), index)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 4:.1f}" y2="{y:.1f}" stroke="#999"/>')
        parts.append(f'<text x="{x:.1f}" y="{y + 12:.1f}" font-size="11" text-anchor="middle" fill="#555">{escape(labels[index])}</text>')
    return parts


@dataclass(frozen=True)
class StripCell:
    column: int  # the night's index among the plot's nights
    status: str  # pass | fail | error | running
    marked: bool  # the quantized model's md5 changed that night
    title: str


@dataclass(frozen=True)
class StripRow:
    label: str
    cells: tuple[StripCell, ...]
    attributes: dict[str, str] = field(default_factory=dict)  # data-* the page's filters read


def status_strip_svg(rows: Sequence[StripRow], dates: Sequence[str], label: str) -> str:
    """One row per ``rows``, one cell per night (``dates``: the nights' dates), coloured by status."""
    row_h = 22
    frame = Frame(NIGHTS_WIDTH, 24 + row_h * len(rows), NIGHTS_LEFT, NIGHTS_RIGHT, 4, 20)
    width = frame.plot_w / max(len(dates), 1)
    parts = [frame.open("strip", label)]
    for index, row in enumerate(rows):
        y = frame.top + index * row_h
        parts.append(f'<g class="f"{_filter_attributes(row.attributes)}>')
        shown = row.label if len(row.label) <= 24 else row.label[:11] + "…" + row.label[-12:]  # it fits the margin
        parts.append(f'<text x="{frame.left - 8}" y="{y + row_h / 2 + 4:.1f}" font-size="12" text-anchor="end" fill="#212121">'
                     f'{escape(shown)}<title>{escape(row.label)}</title></text>')
        parts.append(f'<rect x="{frame.left}" y="{y + 2}" width="{frame.plot_w:.1f}" height="{row_h - 4}" fill="{STATUS_COLOURS["none"]}"/>')
        for cell in row.cells:
            x = frame.left + cell.column * width
            colour = STATUS_COLOURS.get(cell.status, STATUS_COLOURS["none"])
            parts.append(f'<rect class="night {escape(cell.status)}" x="{x + 0.5:.2f}" y="{y + 2}" width="{max(width - 1, 1):.2f}" '
                         f'height="{row_h - 4}" fill="{colour}"><title>{escape(cell.title)}</title></rect>')
            if cell.marked:
                parts.append(diamond(x + width / 2, y + row_h / 2, min(6.0, row_h / 2 - 3), MARK_COLOUR, "md5-changed",
                                     cell.title, stroke="#fff"))
        parts.append("</g>")
    parts += _date_axis(frame, dates, frame.top + row_h * len(rows) + 6)
    parts.append("</svg>")
    return "\n".join(parts)


@dataclass(frozen=True)
class TrendPoint:
    column: int
    value: float
    title: str
    failed: bool = False
    marked: bool = False  # the quantized model's md5 changed that night
    joined: bool = True  # drawn joined to the point before it (False: a gap, a GPU change)


@dataclass(frozen=True)
class TrendLine:
    label: str
    colour: str
    points: tuple[TrendPoint, ...]
    attributes: dict[str, str] = field(default_factory=dict)


def value_text(value: float, scale: str) -> str:
    if math.isinf(value):
        return "inf"
    if scale == "share":
        return f"{value:.1%}"
    if scale == "count":
        return f"{value:g}"
    return f"{value:.3g}"


def _linear_ticks(low: float, high: float, scale: str) -> list[tuple[float, str]]:
    """Ticks at round steps (1, 2, 2.5 or 5 times a power of ten; whole numbers for counts), at most six."""
    span = high - low
    steps = [m * 10.0 ** e for e in range(-3, 7) for m in (1, 2, 2.5, 5)]
    step = next(s for s in steps if span / s <= 5 and (scale != "count" or s >= 1 and s == int(s)))
    first = math.ceil(low / step - 1e-9) * step
    values = [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]
    if values[0] - low > 1e-9:
        values.insert(0, low)
    return [((v - low) / span, value_text(v, scale)) for v in values]


Position = Callable[[float], float]


def _log_axis(values: Sequence[float]) -> tuple[Position, list[tuple[float, str]]]:
    """Decades covering ``values``, with lanes of their own for 0 (below) and +inf (above)."""
    decades = LogScale.covering(values)
    zero, infinite = 0.0, 1.0  # lanes below and above the decades
    inner = (0.1, 0.9)

    def position(value: float) -> float:
        if math.isinf(value) and value > 0:
            return infinite
        if not value > 0:
            return zero
        return inner[0] + decades.position(value) * (inner[1] - inner[0])

    ticks = [(inner[0] + p * (inner[1] - inner[0]), text) for p, text in decades.ticks()] + [(zero, "0")]
    if any(math.isinf(v) for v in values):
        ticks.append((infinite, "inf"))
    return position, ticks


def _linear_axis(values: Sequence[float], scale: str) -> tuple[Position, list[tuple[float, str]]]:
    """``share``: from a multiple of 20 % (at most 90 %) to 100 % or more; ``count``: from 0."""
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    if scale == "share":
        low = min(0.9, math.floor(min(finite) * 5) / 5)  # a multiple of 20 %, at most 90 %
        high = max(1.0, max(finite))
    else:
        low, high = 0.0, max(1.0, math.ceil(max(finite)))
    span = high - low or 1.0

    def position(value: float) -> float:
        return 1.0 if math.isinf(value) else (value - low) / span

    return position, _linear_ticks(low, high, scale)


def _trend_line(frame: Frame, line: TrendLine, width: float, nights: int, position: Position, scale: str) -> list[str]:
    """One line's group: its polylines (broken where a point is not joined) and its points."""
    parts = [f'<g class="f line"{_filter_attributes(line.attributes)}>']

    def polyline(path: list[str]) -> str:
        return f'<polyline fill="none" stroke="{line.colour}" stroke-width="{width:g}" points="{" ".join(path)}"/>'

    path: list[str] = []
    for point in line.points:
        x, y = _night_x(frame, nights, point.column), frame.y(position(point.value))
        if not point.joined and len(path) > 1:
            parts.append(polyline(path))
        if not point.joined:
            path = []
        path.append(f"{x:.1f},{y:.1f}")
    if len(path) > 1:
        parts.append(polyline(path))
    for point in line.points:
        x, y = _night_x(frame, nights, point.column), frame.y(position(point.value))
        title = f"{point.title}: {value_text(point.value, scale)}"
        if point.marked:
            parts.append(diamond(x, y, 6, line.colour, "point md5-changed", title, stroke=MARK_COLOUR))
        else:
            parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="{1.5 + width:g}" fill="{line.colour}"><title>{escape(title)}</title></circle>')
        if point.failed:
            parts.append(f'<circle class="failed" cx="{x:.1f}" cy="{y:.1f}" r="7" fill="none" stroke="{FIRST_COLOUR}" stroke-width="2"/>')
    parts.append("</g>")
    return parts


def trend_svg(lines: Sequence[TrendLine], dates: Sequence[str], scale: str, label: str, height: int = 210) -> str:
    """One figure over the nights: ``scale`` ``log`` (0 and +inf get lanes of their own under and over the
    decades), ``share`` (0..1, shown in %) or ``count``; a low plot labels only its lowest and highest tick."""
    values = [p.value for line in lines for p in line.points]
    frame = Frame(NIGHTS_WIDTH, height, NIGHTS_LEFT, NIGHTS_RIGHT, 10, 28)
    parts = [frame.open("trend", label), frame.box()]
    position, ticks = _log_axis(values) if scale == "log" else _linear_axis(values, scale)
    if frame.plot_h < 100:
        ticks = [min(ticks), max(ticks)]
    parts += frame.grid(ticks)
    for rank, line in enumerate(lines):
        # a line drawn later is thinner: lines with equal values (one model on two GPU types) show as one inside another
        width = 2 + 1.5 * min(len(lines) - 1 - rank, 3)
        parts += _trend_line(frame, line, width, len(dates), position, scale)
    parts += _date_axis(frame, dates, frame.top + frame.plot_h + 6)
    parts.append("</svg>")
    return "\n".join(parts)
