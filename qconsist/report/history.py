"""The history page (``qconsist report --history``; every nightly writes it beside its history database and links
it from the night's report): one self-contained HTML file that shows, per model and GPU type, how the artifact
hashes, verdicts, figures and the entry's own seconds moved over the nights, and on which night what changed first.

Built from a ``HistorySummary`` (``qconsist.history.summary``) with the reports' pieces (``html.page``, the
banner, ``svg``'s plots). Its only script is the filter by model and GPU type: it hides what does not match and
keeps the choice in the address (``history.html#model=NAME&gpu=H100``), so a filtered view can be shared; without
scripts the page shows everything.
"""

from __future__ import annotations

import logging
import os
from html import escape
from pathlib import Path
from typing import Iterable, Sequence

from qconsist.errors import QconsistError
from qconsist.history.db import History
from qconsist.history.figures import Figure, Scale, describe, order
from qconsist.history.summary import EntryNight, HistorySummary, Series, summarize_history
from qconsist.report.html import banner, page, write_report
from qconsist.report.svg import (
    SERIES_COLOURS, StripCell, StripRow, TrendLine, TrendPoint, status_strip_svg, trend_svg, value_text,
)

log = logging.getLogger(__name__)

# the entry task's own wall seconds (``entries.seconds``): shown beside the figures, plotted over the nights with them
SECONDS = Figure("entry.seconds", "Entry duration: the task's own wall seconds, measured where it ran", "seconds",
                 Scale.COUNT, "lower")

_CSS = """
.filters { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid #e0e0e0; z-index: 1; font-size: 14px; }
.filters select { margin: 0 14px 0 4px; font-size: 14px; }
.off { display: none !important; }
td.status-error { background: #e1bee7; font-weight: 600; } td.status-running { background: #eceff1; }
td.md5-changed { background: #fff3e0; font-weight: 600; } table.nights td:nth-child(3) { white-space: nowrap; }
td.md5-changed code::before { content: "◆ "; }
.events li { margin: 3px 0; font-size: 13px; }
.events .when { font-weight: 600; }
.legend span { display: inline-block; margin: 0 14px 4px 0; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
figure { margin: 12px 0 20px; } figcaption { font-weight: 600; font-size: 14px; margin-bottom: 2px; }
table.nights td { font-size: 12px; } table.nights tr.why td { border-top: none; }
table.nights ul.reasons { margin: 0; padding-left: 18px; } table.nights ul.reasons li { font-size: 12px; margin: 1px 0; font-weight: 400; }
table.nights td:first-child, .events .when { white-space: nowrap; }
"""

# The filters: the address holds the choice (#model=NAME&gpu=TYPE); every element with data-model / data-gpu
# (data-gpu: the GPU labels it covers, separated by |) that does not match is hidden.
_SCRIPT = """
(function () {
  var model = document.getElementById('filter-model'), gpu = document.getElementById('filter-gpu');
  var count = document.getElementById('filter-count');
  function wanted() {
    var found = {model: '', gpu: ''};
    location.hash.replace(/^#/, '').split('&').forEach(function (part) {
      var pair = part.split('=');
      if (pair[0] in found) { found[pair[0]] = decodeURIComponent(pair[1] || ''); }
    });
    return found;
  }
  function choose(select, value) {
    Array.prototype.forEach.call(select.options, function (option) {
      option.selected = option.value === value;
      if (option.selected) { option.setAttribute('selected', ''); } else { option.removeAttribute('selected'); }
    });
  }
  function apply() {
    var f = wanted();
    choose(model, f.model); choose(gpu, f.gpu);
    document.querySelectorAll('[data-model], [data-gpu]').forEach(function (element) {
      var m = element.getAttribute('data-model'), g = element.getAttribute('data-gpu');
      var shown = (!f.model || m === null || m === f.model) && (!f.gpu || g === null || g.split('|').indexOf(f.gpu) >= 0);
      element.classList.toggle('off', !shown);
    });
    var rows = document.querySelectorAll('tr.series'), visible = document.querySelectorAll('tr.series:not(.off)');
    count.textContent = 'showing ' + visible.length + ' of ' + rows.length + ' timelines';
  }
  function update() {
    var parts = [];
    if (model.value) { parts.push('model=' + encodeURIComponent(model.value)); }
    if (gpu.value) { parts.push('gpu=' + encodeURIComponent(gpu.value)); }
    history.replaceState(null, '', parts.length ? '#' + parts.join('&') : location.pathname);
    apply();
  }
  model.addEventListener('change', update); gpu.addEventListener('change', update);
  window.addEventListener('hashchange', apply);
  apply();
})();
"""


def history_page_path(database: Path | str) -> Path:
    """Where the nightly writes the history page of ``database``: beside it, ``history.sqlite`` -> ``history.html``."""
    database = Path(database)
    return database.with_name(database.name + ".html") if database.suffix == ".html" else database.with_suffix(".html")


def write_history_page(database: Path | str, output: Path | str | None = None) -> Path:
    """Read the history ``database`` (read-only) and write its page to ``output`` (default: ``history_page_path``)."""
    output = Path(output) if output is not None else history_page_path(database)
    summary = summarize_history(History(database, read_only=True))
    return write_report(render_history(summary, output.parent), output)


def _attributes(model: str | None = None, gpus: Iterable[str] = ()) -> str:
    parts = f' data-model="{escape(model)}"' if model is not None else ""
    gpus = list(gpus)
    return parts + (f' data-gpu="{escape("|".join(gpus))}"' if gpus else "")


def _md5(value: str | None) -> str:
    return f"<code>{escape(value[:10])}</code>" if value else "—"


def _link(text: str, target: str | None, relative_to: Path | None) -> str:
    if target is None or relative_to is None:
        return text
    return f'<a href="{escape(os.path.relpath(target, relative_to))}">{text}</a>'


def _failed_checks(night: EntryNight) -> list[str]:
    return [reason.split(":", 1)[0] for reason in night.reasons]


def _changes(series: Series, index: int, brief: bool = False) -> list[str]:
    """What changed on the series' night ``index`` against the night before, in words (``brief``: hashes and
    verdict only)."""
    night = series.nights[index]
    before = series.nights[index - 1] if index else None
    said = []
    for stage in night.changed:
        old = before.hashes.get(stage) if before else None
        said.append(f"<b>{escape(stage)}</b> md5 {_md5(old)} → {_md5(night.hashes.get(stage))}")
    if night.previous_status:
        said.append(f"verdict {escape(night.previous_status)} → <b>{escape(night.status.upper() if night.status == 'fail' else night.status)}</b>")
    if brief:
        return said if said or not night.environment else ["environment changed"]
    if night.status == "fail" and night.eventful:
        checks = ", ".join(_failed_checks(night))
        if checks:
            said.append(f"failed checks: {escape(checks)}")
    if night.first_diverging_node and night.eventful:
        said.append("first diverging node " + _node(night, limit=None))
    if night.error and night.eventful:
        said.append(f"error: {escape(night.error)}")
    if night.environment:
        shown = "; ".join(night.environment[:3]) + (f"; {len(night.environment) - 3} more" if len(night.environment) > 3 else "")
        said.append(f"environment: {escape(shown)}")
    return said


def _status_cell(status: str) -> str:
    return f'<td class="status-{escape(status)}">{escape(status)}</td>'


def _latest_section(summary: HistorySummary, relative_to: Path | None) -> str:
    rows = []
    for series in summary.series:
        latest, since = series.latest, series.since()
        eventful = ([i for i, n in enumerate(series.nights) if n.changed or n.previous_status]
                    or [i for i, n in enumerate(series.nights) if n.eventful])
        last = f"{series.nights[eventful[-1]].date}: " + "; ".join(_changes(series, eventful[-1], brief=True)) if eventful else "nothing"
        counts = ", ".join(f"{series.count(s)} {s}" for s in ("pass", "fail", "error") if series.count(s))
        rows.append(
            f'<tr class="series"{_attributes(series.model, series.gpus)}><td><a href="#model-{escape(series.model)}">'
            f"{escape(series.model)}</a></td><td>{escape(' / '.join(series.gpus))}</td>"
            f"<td>{_link(escape(latest.date), latest.report, relative_to)}</td>{_status_cell(latest.status)}"
            f"<td>{_md5(latest.quantized_md5)} since {escape(since.date)}</td><td>{len(series.nights)}: {escape(counts)}</td>"
            f"<td>{last}</td></tr>")
    return ("<h2>Latest</h2><table><tr><th>model</th><th>GPU type</th><th>latest night</th><th>status</th>"
            "<th>quantized md5</th><th>nights</th><th>last change</th></tr>" + "".join(rows) + "</table>")


def _strip(summary: HistorySummary, series_list: Sequence[Series], every_model: bool = False) -> str:
    """The nights of ``series_list`` as a status strip, one row per series (``every_model``: rows named by their
    key and filtered by model too)."""
    columns = {night.night_id: index for index, night in enumerate(summary.nights)}
    rows = []
    for series in series_list:
        cells = tuple(
            StripCell(columns[n.night_id], n.status, n.quantized_changed,
                      f"{series.key} · {n.date} · {n.night_id}: {n.status}" + ("; quantized md5 changed" if n.quantized_changed else "")
                      + (f"; first diverging node {n.first_diverging_node}" if n.first_diverging_node else ""))
            for n in series.nights if n.night_id in columns)
        attributes = {"data-gpu": "|".join(series.gpus)}
        if every_model:
            attributes = {"data-model": series.model, **attributes}
        rows.append(StripRow(series.key if every_model else " / ".join(series.gpus), cells, attributes))
    label = "every model" if every_model else series_list[0].model
    return status_strip_svg(rows, [n.started for n in summary.nights], f"{label}: status night by night")


def _events(series_list: Sequence[Series]) -> str:
    """Each night on which something changed, newest first; the same change on several GPU types is one item."""
    found: dict[tuple[str, str, str], list[str]] = {}  # (started, night, what changed) -> GPU labels
    for series in series_list:
        for index, night in enumerate(series.nights):
            if index and night.eventful:
                found.setdefault((night.started, night.night_id, "; ".join(_changes(series, index))), []).append(night.gpu)
    if not found:
        return '<p class="muted">Nothing changed over these nights: same hashes, same verdict, same environment.</p>'
    several = len(series_list) > 1 or len({g for s in series_list for g in s.gpus}) > 1
    items = []
    for (started, night_id, said), gpus in sorted(found.items(), key=lambda item: item[0][:2], reverse=True):
        where = f" [{escape(', '.join(gpus))}]" if several else ""
        items.append(f'<li{_attributes(None, gpus)}><span class="when">{escape(started[:10])}</span> '
                     f"<code>{escape(night_id)}</code>{where}: {said}</li>")
    return '<h3>What changed, newest first</h3><ol class="events">' + "".join(items) + "</ol>"


def _groups(series: Series) -> list[list[EntryNight]]:
    """The series' nights, oldest first, with each run of nights that repeat the night before in one group."""
    groups: list[list[EntryNight]] = []
    for night in series.nights:
        if groups and night.same_as(groups[-1][-1]):
            groups[-1].append(night)
        else:
            groups.append([night])
    return groups


def _shortened(text: str, limit: int | None = 160) -> str:
    """``text`` cut to ``limit`` characters, the whole of it on hover."""
    if limit is None or len(text) <= limit:
        return escape(text)
    return f'<span title="{escape(text)}">{escape(text[:limit].rstrip())}…</span>'


def _figure_cell(night: EntryNight, name: str) -> str:
    value = night.figures.get(name)
    return "<td>—</td>" if value is None else f"<td>{escape(value_text(value, describe(name).scale.value))}</td>"


def _node(night: EntryNight, limit: int | None = 60) -> str:
    """The first diverging node against the baseline, and where the divergence was born (its origin nodes);
    names cut to ``limit`` characters (the whole on hover)."""
    if not night.first_diverging_node:
        return "—"
    first = f"<code>{_shortened(night.first_diverging_node, limit)}</code>"
    if night.origin_nodes == (night.first_diverging_node,):
        return first + " (the origin node)"
    origins = ", ".join(night.origin_nodes)
    return first + " (origin nodes: " + (f"<code>{_shortened(origins, limit and 2 * limit)}</code>)" if origins else "none)")


def _seconds_cell(group: Sequence[EntryNight]) -> str:
    """The entry's own seconds on a row of nights: one night's, or the lowest and highest of the group's (each
    night's on hover); — where none was measured."""
    known = [n.seconds for n in group if n.seconds is not None]
    if not known:
        return "<td>—</td>"
    low, high = min(known), max(known)
    text = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"
    if len(group) == 1:
        return f"<td>{text}</td>"
    each = ", ".join("—" if n.seconds is None else f"{n.seconds:.1f}" for n in group)
    return f'<td title="{escape(f"each night, oldest first: {each}")}">{text}</td>'


def _nights_table(series: Series, relative_to: Path | None) -> str:
    figures = order(name for night in series.nights for name in night.figures)
    diverged = any(n.first_diverging_node for n in series.nights)
    timed = any(n.seconds is not None for n in series.nights)  # an older history measured none
    head = ("<tr><th>nights</th><th>status</th><th>quantized md5</th>"
            + (f'<th title="{escape(SECONDS.label)}">seconds</th>' if timed else "")
            + "".join(f'<th title="{escape(describe(n).label)}">{escape(describe(n).short)}</th>' for n in figures)
            + ("<th>first diverging node</th>" if diverged else "") + "</tr>")
    width = 3 + int(timed) + len(figures) + int(diverged)
    rows = []
    for group in reversed(_groups(series)):
        first, last = group[0], group[-1]
        until = last.date[5:] if last.date[:4] == first.date[:4] else last.date
        when = escape(first.date) if len(group) == 1 else f"{escape(first.date)} – {escape(until)} ({len(group)} nights)"
        ids = first.night_id if len(group) == 1 else f"{first.night_id} … {last.night_id}"
        md5_class = ' class="md5-changed"' if first.quantized_changed else ""
        node = f"<td>{_node(first)}</td>" if diverged else ""
        rows.append(
            f'<tr{_attributes(None, [first.gpu])}><td title="{escape(ids)}">{_link(when, last.report, relative_to)}</td>'
            f"{_status_cell(first.status)}<td{md5_class}>{_md5(first.quantized_md5)}</td>"
            + (_seconds_cell(group) if timed else "")
            + "".join(_figure_cell(first, name) for name in figures) + node + "</tr>")
        why = [_shortened(reason, 300) for reason in first.reasons] or ([_shortened(f"error: {first.error}", 300)] if first.error else [])
        if why:  # the gate's reasons (or the error) on a row of their own, under the night's figures
            rows.append(f'<tr class="why"{_attributes(None, [first.gpu])}><td></td><td colspan="{width - 1}"><ul class="reasons">'
                        + "".join(f"<li>{reason}</li>" for reason in why) + "</ul></td></tr>")
    gpus = " / ".join(series.gpus)
    return (f'<div{_attributes(None, series.gpus)}><h3>Nights of <code>{escape(series.key)}</code> on {escape(gpus)}, newest first</h3>'
            '<table class="nights">' + head + "".join(rows) + "</table></div>")


def _model_section(summary: HistorySummary, model: str, relative_to: Path | None) -> str:
    series_list = [s for s in summary.series if s.model == model]
    gpus = list(dict.fromkeys(g for s in series_list for g in s.gpus))
    parts = [f'<section{_attributes(model, gpus)}><h2 id="model-{escape(model)}">{escape(model)}</h2>',
             _strip(summary, series_list), _events(series_list)]
    parts += [_nights_table(series, relative_to) for series in series_list]
    parts.append("</section>")
    return "\n".join(parts)


def _value(night: EntryNight, name: str) -> float | None:
    """A night's figure ``name``, or for ``SECONDS`` the entry's own seconds (to 0.1 s)."""
    if name == SECONDS.name:
        return None if night.seconds is None else round(night.seconds, 1)
    return night.figures.get(name)


def _figures_section(summary: HistorySummary) -> str:
    timed = any(n.seconds is not None for s in summary.series for n in s.nights)
    names = [*summary.figures, *([SECONDS.name] if timed else [])]  # the entries' seconds: an entry getting slower
    if not names:
        return "<h2>Figures over the nights</h2><p class=\"muted\">No night recorded a figure.</p>"
    columns = {night.night_id: index for index, night in enumerate(summary.nights)}
    colours = {s.key: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, s in enumerate(summary.series)}
    legend = "".join(f'<span{_attributes(s.model, s.gpus)}><i style="background:{colours[s.key]}"></i>{escape(s.key)}</span>'
                     for s in summary.series)
    parts = ["<h2>Figures over the nights</h2>",
             "<p>One line per model and GPU type; a red ring: the gate failed that night; ◆: the quantized model's md5 "
             "changed that night. Hover a point for its night and value.</p>", f'<p class="legend">{legend}</p>']
    for name in names:
        figure = SECONDS if name == SECONDS.name else describe(name)
        lines = []
        for series in summary.series:
            points = []
            for index, night in enumerate(series.nights):
                value = _value(night, name)
                if value is None or night.night_id not in columns:
                    continue
                before = series.nights[index - 1] if index else None
                joined = before is not None and _value(before, name) is not None and before.gpu == night.gpu
                points.append(TrendPoint(columns[night.night_id], value, f"{series.key} · {night.date} · {night.night_id}",
                                         night.status == "fail", night.quantized_changed, joined))
            if points:
                lines.append(TrendLine(series.key, colours[series.key], tuple(points),
                                       {"data-model": series.model, "data-gpu": "|".join(series.gpus)}))
        scale = figure.scale.value
        models = sorted({line.attributes["data-model"] for line in lines})
        # a magnitude is in its model's own units (probabilities, logits, pixels): one axis per model
        groups = [(model, [line for line in lines if line.attributes["data-model"] == model]) for model in models] \
            if scale == "log" and len(models) > 1 else [(None, lines)]
        for model, group in groups:
            values = {point.value for line in group for point in line.points}
            same = f": {value_text(values.pop(), scale)} on every night" if len(values) == 1 else ""  # a low plot says so
            whose = f" — {model}" if model else ""
            parts.append(f'<figure{_attributes(model, [g for line in group for g in line.attributes["data-gpu"].split("|")])}>'
                         f"<figcaption>{escape(figure.label)}{escape(whose)}{escape(same)} <span class=\"muted\">({escape(name)})</span></figcaption>"
                         + trend_svg(group, [n.started for n in summary.nights], scale, figure.label + whose, 110 if same else 210)
                         + "</figure>")
    return "\n".join(parts)


def _filters(summary: HistorySummary) -> str:
    models = "".join(f'<option value="{escape(m)}">{escape(m)}</option>' for m in summary.models)
    gpus = "".join(f'<option value="{escape(g)}">{escape(g)}</option>' for g in summary.gpu_types)
    return ('<form class="filters" onsubmit="return false">Model <select id="filter-model"><option value="">all models</option>'
            f'{models}</select>GPU type <select id="filter-gpu"><option value="">all GPU types</option>{gpus}</select>'
            '<span id="filter-count" class="muted"></span></form>')


def render_history(summary: HistorySummary, relative_to: Path | None = None) -> str:
    """The history page of ``summary``; links to each night's report are relative to ``relative_to`` (the page's
    folder; none without it)."""
    latest = [s.latest.status for s in summary.series]
    state = "fail" if "fail" in latest else "error" if "error" in latest else "pass" if summary.passed else "neutral"
    nights = summary.nights
    span = f"{nights[0].date} – {nights[-1].date}" if nights else "no night"
    title = f"Nightly history: {len(summary.models)} model(s), {len(nights)} night(s), {span}"
    counts = ", ".join(f"{latest.count(s)} {s}" for s in ("pass", "fail", "error", "running") if latest.count(s))
    body = [banner(state, title, f"latest: {counts} · {summary.source}"), "<main>", _filters(summary),
            '<p class="muted">Each cell of a strip is a night: green pass, red fail, purple error, grey no run; '
            "◆ the quantized model's md5 changed that night. Hover a cell for the night.</p>",
            _latest_section(summary, relative_to)]
    if len(summary.series) > 1:  # every model on one time axis: what failed together, what changed first
        body += ["<h3>Every model, night by night</h3>", _strip(summary, summary.series, every_model=True)]
    body += [_model_section(summary, model, relative_to) for model in summary.models]
    body += [_figures_section(summary), "</main>"]
    return page(f"qconsist history: {', '.join(summary.models)}", body, css=_CSS, script=_SCRIPT)


def history_link(database: Path | str | None, relative_to: Path) -> str | None:
    """The history page of ``database`` as a link relative to ``relative_to``, where that page exists."""
    if not database:
        return None
    target = history_page_path(database)
    return os.path.relpath(target, relative_to) if target.is_file() else None


def nightly_history_page(database: Path) -> Path | None:
    """The nightly's history page, written after each night; a failure to write it is logged, never the night's."""
    try:
        return write_history_page(database)
    except (QconsistError, OSError) as exc:
        log.error("could not write the history page of %s: %s", database, exc)
        return None
