"""Self-contained HTML reports (no external files; no scripts but the history page's filters): a run, a diff, a
nightly entry, a night, the history.

Every report is built from the same pieces: the verdict banner and its checks, the artifacts table, the
per-node divergence along the topological order (inline SVG), the origin nodes, and the GPU configuration
matrix with latencies where a locate report exists.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any, Iterable

from qconsist.locate.report import LocateReport
from qconsist.report.svg import NodePoint, divergence_svg
from qconsist.store.atomic import write_atomic

PASS_COLOUR = "#2e7d32"
FAIL_COLOUR = "#c62828"
ERROR_COLOUR = "#6a1b9a"
NEUTRAL_COLOUR = "#455a64"

_CSS = f"""
body {{ font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0; color: #212121; }}
main {{ padding: 16px 24px; }}
.banner {{ color: #fff; padding: 18px 24px; font-size: 26px; font-weight: 600; min-height: 40px; }}
.banner small {{ display: block; font-size: 14px; font-weight: 400; opacity: .9; }}
.pass {{ background: {PASS_COLOUR}; }} .fail {{ background: {FAIL_COLOUR}; }}
.error {{ background: {ERROR_COLOUR}; }} .neutral {{ background: {NEUTRAL_COLOUR}; }}
h2 {{ border-bottom: 2px solid #e0e0e0; padding-bottom: 4px; margin-top: 28px; }}
table {{ border-collapse: collapse; margin: 8px 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
table {{ max-width: 100%; }}
td code {{ overflow-wrap: anywhere; }} /* a long node or initializer list wraps inside the page's width */
td[class^="status-"] {{ white-space: nowrap; }}
.reasons-line {{ color: {FAIL_COLOUR}; font-weight: 600; }}
th {{ background: #eceff1; }}
td.status-pass {{ background: #c8e6c9; }} td.status-fail {{ background: #ffcdd2; font-weight: 600; }}
td.status-not_applicable {{ background: #eeeeee; color: #555; }}
tr.changed td {{ background: #fff3e0; }}
code {{ font-family: "DejaVu Sans Mono", monospace; font-size: 12px; }}
.reasons li {{ color: {FAIL_COLOUR}; font-weight: 600; margin: 4px 0; }}
.muted {{ color: #757575; }}
"""


def page(title: str, body: Iterable[str], css: str = "", script: str = "") -> str:
    """A whole HTML page; ``css`` adds to the reports' style, ``script`` (the history page's filters) runs last."""
    tail = f"<script>{script}</script>\n" if script else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{_CSS}{css}</style></head><body>\n" + "\n".join(body) + "\n" + tail
        + "</body></html>\n"
    )


def banner(state: str, title: str, subtitle: str = "") -> str:
    sub = f"<small>{escape(subtitle)}</small>" if subtitle else ""
    return f'<div class="banner {state}" id="verdict">{escape(title)}{sub}</div>'


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return escape(str(value)) if value is not None else "—"


def verdict_section(verdict: dict[str, Any]) -> str:
    parts = ["<h2>Verdict</h2>"]
    failed = [check["name"] for check in verdict.get("checks", []) if check.get("status") == "fail"]
    listed = {f"{check['name']}: {check['message']}" for check in verdict.get("checks", [])}
    if failed:  # each reason once: its check's row below says it
        parts.append(f'<p class="reasons-line">{len(failed)} check(s) failed: '
                     + ", ".join(f"<b>{escape(name)}</b>" for name in failed) + " (their figures in the table below).</p>")
    others = [r for r in verdict.get("reasons") or [] if r not in listed]
    if others:
        parts.append('<ol class="reasons">' + "".join(f"<li>{escape(r)}</li>" for r in others) + "</ol>")
    meta = [
        ("candidate", verdict.get("candidate")), ("baseline", verdict.get("baseline") or "none (first night)"),
        ("policy", (verdict.get("policy") or {}).get("source")),
        ("stages changed", ", ".join(verdict.get("changed_stages") or []) or "none"),
        ("first diverging node", verdict.get("first_diverging_node") or "—"),
    ]
    parts.append("<table>" + "".join(f"<tr><th>{k}</th><td><code>{_fmt(v)}</code></td></tr>" for k, v in meta) + "</table>")
    rows = []
    for check in verdict.get("checks", []):
        tolerance = ", ".join(f"{k}={_fmt(v)}" for k, v in (check.get("tolerance") or {}).items())
        rows.append(
            f"<tr><td>{escape(check['name'])}</td><td class=\"status-{check['status']}\">{escape(check['status'])}</td>"
            f"<td>{escape(check['message'])}</td><td><code>{escape(tolerance)}</code></td></tr>"
        )
    parts.append("<table><tr><th>check</th><th>status</th><th>detail</th><th>tolerance</th></tr>" + "".join(rows) + "</table>")
    return "\n".join(parts)


def artifacts_section(stages: list[dict[str, Any]], changed: Iterable[str] = (), title: str = "Artifacts") -> str:
    changed = set(changed)
    rows = []
    for stage in stages:
        artifact = stage.get("artifact") or {}
        css = ' class="changed"' if stage.get("name") in changed else ""
        mark = " (changed)" if stage.get("name") in changed else ""
        rows.append(
            f"<tr{css}><td>{escape(str(stage.get('name')))}{mark}</td><td><code>{escape(str(artifact.get('path', '')))}</code></td>"
            f"<td>{_fmt(artifact.get('size'))}</td><td><code>{escape(str(artifact.get('md5', '')))}</code></td>"
            f"<td><code>{escape(str(artifact.get('content', ''))[:16])}</code></td><td>{_fmt(stage.get('seconds'))}</td></tr>"
        )
    if not rows:
        return f"<h2>{escape(title)}</h2><p class=\"muted\">No artifacts.</p>"
    return (f"<h2>{escape(title)}</h2><table><tr><th>stage</th><th>file</th><th>bytes</th><th>md5</th>"
            "<th>content sha256</th><th>seconds</th></tr>" + "".join(rows) + "</table>")


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def node_magnitude(node: dict[str, Any]) -> tuple[float, bool]:
    """A diverging node's greatest absolute difference from its element statistics (exact, ``True``), or
    the lower bound its fingerprints give (|Δmin|, |Δmax|, |Δmean| of the first differing sample)."""
    elements = node.get("elements") or {}
    if elements.get("max_abs") is not None:
        return _number(elements["max_abs"]), True
    summary = node.get("summary") or {}
    a, b = summary.get("a") or {}, summary.get("b") or {}
    gaps = [abs(_number(b.get(k)) - _number(a.get(k))) for k in ("min", "max", "mean")]
    gaps = [g for g in gaps if not math.isnan(g)]
    return (max(gaps) if gaps else 0.0), False


def diff_points(diff: dict[str, Any]) -> tuple[list[NodePoint], str | None, list[dict[str, Any]]]:
    """Plot points (the diverging nodes, in topological order), first diverging node and origin rows
    from a ``qconsist diff --json`` result."""
    tensors = diff.get("tensors") or {}
    nodes = tensors.get("nodes") or []
    points = []
    for node in nodes:
        value, exact = node_magnitude(node)
        points.append(NodePoint(str(node.get("label")), value if math.isfinite(value) or math.isinf(value) else 0.0,
                                bool(node.get("origin")), exact=exact))
    return points, tensors.get("first"), [n for n in nodes if n.get("origin")]


def divergence_section(diff: dict[str, Any] | None, against: str = "") -> str:
    title = "<h2>Per-node divergence along the topological order" + (f" ({escape(against)})" if against else "") + "</h2>"
    if not diff:
        return title + '<p class="muted">No tensor-level diff: both sides need inference runs with dumps.</p>'
    tensors = diff.get("tensors")
    if not tensors:
        notes = " ".join(diff.get("notes") or []) or "the runs hold no tensor dumps"
        return title + f'<p class="muted">No per-node comparison: {escape(notes)}.</p>'
    points, first, origins = diff_points(diff)
    compared = tensors.get("compared")
    if first is None:
        return title + f"<p>All {compared} compared tensors are bit-identical.</p>"
    exact = sum(1 for n in tensors.get("nodes") or [] if node_magnitude(n)[1])
    out = [title, f"<p>Divergence starts at <code>{escape(first)}</code>: {len(points)} of {compared} compared tensors "
                  f"differ. Bars: greatest |difference| per diverging node, in topological order: {exact} exact from raw "
                  f"tensors (solid), {len(points) - exact} a lower bound from the fingerprints' min, max and mean "
                  "(hatched, ≥).</p>",
           divergence_svg(points, first), "<h2>Origin nodes</h2>"]
    if origins:
        out.append("<p>Nodes whose outputs differ although every input they read was observed and is identical "
                   "(constants by value; those that differ are listed):</p><table>"
                   "<tr><th>node</th><th>op</th><th>initializers changed</th><th>greatest |diff|</th><th>samples</th></tr>")
        for row in origins:
            value, exact_value = node_magnitude(row)
            if exact_value:
                shown = _fmt(value)
            elif value > 0:
                shown = f"≥ {_fmt(value)} (lower bound)"
            else:  # the fingerprints differ, their min, max and mean do not
                shown = "&gt; 0 (min, max and mean equal; raw tensors would tell)"
            inits = ", ".join(row.get("initializers_changed") or []) or "none"
            out.append(f"<tr><td><code>{escape(str(row.get('label')))}</code></td><td>{_fmt(row.get('op_b'))}</td>"
                       f"<td><code>{escape(inits[:300])}</code></td><td>{shown}</td><td>{_fmt(row.get('origin_samples'))}</td></tr>")
        out.append("</table>")
    else:
        out.append('<p class="muted">No origin node among the compared tensors.</p>')
    spans = [n for n in tensors.get("nodes") or [] if n.get("finding") == "span"]
    if spans:
        out.append("<h2>Spans</h2><p>Tensors that differ although the nearest observed tensors upstream are identical; "
                   "some tensors in between were not observed, so the difference starts somewhere among the nodes "
                   "listed:</p><table><tr><th>span ending at</th><th>nodes inside</th><th>not observed</th>"
                   "<th>greatest |diff|</th><th>samples</th></tr>")
        for row in spans:
            value, exact_value = node_magnitude(row)
            shown = _fmt(value) + ("" if exact_value else " (lower bound)")
            inside, hidden = ", ".join(row.get("span") or []), ", ".join(row.get("unobserved") or [])
            out.append(f"<tr><td><code>{escape(str(row.get('label')))}</code></td><td><code>{escape(inside[:600])}</code></td>"
                       f"<td><code>{escape(hidden[:300])}</code></td><td>{shown}</td><td>{_fmt(row.get('origin_samples'))}</td></tr>")
        out.append("</table>")
    for replay in diff.get("replays") or []:  # diff --replay: one line per origin
        out.append(f"<p>Replay of <code>{escape(str(replay.get('label')))}</code>: {escape(str(replay.get('summary')))}</p>")
    return "\n".join(out)


def gpu_section(locate: LocateReport | None, skipped: str | None) -> str:
    title = "<h2>GPU configuration matrix</h2>"
    if not locate:
        return title + f"<p class=\"muted\">Not measured: {escape(skipped or 'no locate report')}.</p>"
    recommendation = locate.recommendation
    rec = recommendation.config if recommendation is not None else None
    rows = []
    for cfg in locate.configs:
        latency = cfg.latency
        star = " ★ recommended" if cfg.label == rec else ""
        rows.append(f"<tr><td><code>{escape(str(cfg.label))}</code>{star}</td><td>{_fmt(latency and latency.median_ms)}</td>"
                    f"<td>{_fmt(latency and latency.spread)}</td><td>{_fmt(cfg.stable)}</td></tr>")
    table = ("<table><tr><th>config</th><th>median ms</th><th>spread (IQR / median)</th><th>bit-stable</th></tr>"
             + "".join(rows) + "</table>" if rows else "<p class=\"muted\">The locate report lists no configurations.</p>")
    cost = recommendation.cost if recommendation is not None else None
    text = f"<p>Recommended: <code>{escape(str(rec))}</code>" + (f", cost {_fmt(cost)}× the fastest" if cost else "") + "</p>" if rec else ""
    if locate.nodes:
        text += "<p>Sensitive nodes: " + ", ".join(f"<code>{escape(n.label)}</code> ({escape(n.why)})" for n in locate.nodes[:20]) + "</p>"
    return title + table + text


def verdict_state(verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return "neutral"
    return "pass" if verdict.get("passed") else "fail"


def entry_body(name: str, stages: list[dict[str, Any]], verdict: dict[str, Any] | None, locate: LocateReport | None,
               skipped: str | None, heading: str = "h1") -> list[str]:
    body = []
    if heading == "h2":
        body.append(f"<h2 id=\"model-{escape(name)}\">{escape(name)}</h2>")
    if verdict:
        body.append(verdict_section(verdict))
    body.append(artifacts_section(stages, (verdict or {}).get("changed_stages") or []))
    body.append(divergence_section((verdict or {}).get("diff"), "candidate vs baseline"))
    body.append(gpu_section(locate, skipped))
    return body


def write_report(html: str, output: Path) -> Path:

    write_atomic(Path(output), lambda tmp: tmp.write_text(html, encoding="utf-8"))
    return Path(output)
