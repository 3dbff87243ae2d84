"""Inline SVG of the per-node divergence along the topological order: where it starts, where it grows.

One bar per node in topological order; its height is log10 of the node's greatest absolute difference
(identical nodes get no bar). The first diverging node is marked with a vertical line and origin nodes
with orange diamonds, so the reader sees where the difference is born and how it grows downstream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

# Colours the screenshot test looks for.
BAR_COLOUR = "#1565c0"
ORIGIN_COLOUR = "#ef6c00"
FIRST_COLOUR = "#c62828"


@dataclass(frozen=True)
class NodePoint:
    """One node of the plot: its name, greatest absolute difference (0 = identical) and role."""

    name: str
    max_abs_diff: float
    origin: bool = False
    mismatched_fraction: float = 0.0


def _log_height(value: float, low: float, high: float) -> float:
    if value <= 0 or not math.isfinite(value) and not math.isinf(value):
        return 0.0
    if math.isinf(value):
        return 1.0
    span = high - low or 1.0
    return max(0.04, min(1.0, (math.log10(value) - low) / span))


def divergence_svg(points: list[NodePoint], first: str | None, width: int = 960, height: int = 260) -> str:
    """The divergence plot as an ``<svg>`` element (self-contained, no scripts)."""
    if not points:
        return '<p class="muted">No per-node comparison in this report.</p>'
    left, right, top, bottom = 56, 12, 14, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    finite = [p.max_abs_diff for p in points if p.max_abs_diff > 0 and math.isfinite(p.max_abs_diff)]
    low = math.floor(math.log10(min(finite))) if finite else -8
    high = math.ceil(math.log10(max(finite))) if finite else 0
    if high <= low:
        high = low + 1
    step = plot_w / len(points)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="divergence" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="per-node divergence">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#bbb"/>',
    ]
    for exponent in range(low, high + 1):
        y = top + plot_h - (exponent - low) / (high - low) * plot_h
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#555">1e{exponent}</text>')
    bar_w = max(1.0, step * 0.8)
    for index, point in enumerate(points):
        h = _log_height(point.max_abs_diff, low, high) * plot_h
        if h <= 0:
            continue
        x = left + index * step
        title = escape(f"{index}: {point.name} max abs diff {point.max_abs_diff:.3g}")
        parts.append(
            f'<rect class="bar" x="{x:.2f}" y="{top + plot_h - h:.2f}" width="{bar_w:.2f}" height="{h:.2f}" '
            f'fill="{BAR_COLOUR}"><title>{title}</title></rect>'
        )
    for index, point in enumerate(points):
        if point.origin:
            cx, cy = left + (index + 0.5) * step, top + plot_h + 10
            parts.append(
                f'<path class="origin" d="M{cx:.1f},{cy - 7:.1f} L{cx + 7:.1f},{cy:.1f} L{cx:.1f},{cy + 7:.1f} '
                f'L{cx - 7:.1f},{cy:.1f} Z" fill="{ORIGIN_COLOUR}"><title>{escape("origin: " + point.name)}</title></path>'
            )
    names = [p.name for p in points]
    if first in names:
        x = left + (names.index(first) + 0.5) * step
        parts.append(f'<line class="first" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" stroke="{FIRST_COLOUR}" stroke-width="2" stroke-dasharray="5,3"/>')
        anchor = "start" if x < left + plot_w * 0.7 else "end"
        dx = 5 if anchor == "start" else -5
        parts.append(f'<text x="{x + dx:.1f}" y="{top + 14}" font-size="12" fill="{FIRST_COLOUR}" text-anchor="{anchor}">first diverging: {escape(first)}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" font-size="12" text-anchor="middle" fill="#333">'
                 f'{len(points)} nodes in topological order → (bar: greatest |difference|, log scale; ◆ origin node)</text>')
    parts.append("</svg>")
    return "\n".join(parts)
