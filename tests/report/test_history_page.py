"""The history page (``qconsist report --history``), from four weeks of nights built on real nightly runs
(``history_nights``), checked for content, in a real headless Chromium (its filters, a screenshot), and linked
from every night's report."""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
from dataclasses import dataclass, replace
from html import escape, unescape
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from browser import dump_dom, screenshot
from history_nights import (
    CHANGED_DAY, CHANGED_ENVIRONMENT, DAYS, ENVIRONMENT_DAY, FIXED_DAY, LOST_DAY, RealNights, run_real_nights, weeks_of_nights,
)
from qconsist.cli import app
from qconsist.environment import fingerprint
from qconsist.history import History, summarize_history
from qconsist.history.summary import HistorySummary
from qconsist.nightly import NightlyResult, load_nightly, run_nightly
from qconsist.report import render_history
from qconsist.report.history import history_page_path
from qconsist.report.svg import MARK_COLOUR, STATUS_COLOURS

KEYS = ["convnet", "convnet-percentile@H100", "convnet-percentile@H200"]


@dataclass
class Weeks:
    real: RealNights
    database: Path
    nights: list[str]  # the replayed nights, oldest first
    tonight: NightlyResult  # a real night on top of them


@pytest.fixture(scope="module")
def weeks(tmp_path_factory) -> Weeks:
    folder = tmp_path_factory.mktemp("history-weeks")
    real = run_real_nights(folder)
    database = folder / "runs" / "weeks.sqlite"
    today = dt.datetime.now(dt.timezone.utc).replace(hour=2, minute=0, second=0, microsecond=0)
    nights = weeks_of_nights(History(database), real, today - dt.timedelta(days=DAYS))
    tonight = run_nightly(replace(load_nightly(real.config), history=database), only=["convnet"])
    return Weeks(real, database, nights, tonight)


@pytest.fixture(scope="module")
def page(weeks, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("history-page") / "history.html"
    result = CliRunner().invoke(app, ["report", "--history", str(weeks.database), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"history page: {output} (3 timeline(s), {DAYS + 1} night(s))\n"
    return output


def test_summary_follows_the_real_nights(weeks):
    summary = summarize_history(History(weeks.database, read_only=True))
    assert [s.key for s in summary.series] == KEYS
    assert [n.night_id for n in summary.nights] == [*weeks.nights, weeks.tonight.night_id]
    convnet = summary.series[0]
    assert [n.status for n in convnet.nights] == (
        ["pass"] * CHANGED_DAY + ["fail"] * (FIXED_DAY - CHANGED_DAY) + ["pass"] * (DAYS - FIXED_DAY + 1))
    changed = convnet.nights[CHANGED_DAY]
    verdict = weeks.real.changed["convnet"].verdict
    assert changed.changed == ("quantize",) and changed.previous_status == "pass"
    assert changed.first_diverging_node == verdict.first_diverging_node and changed.first_diverging_node
    assert changed.origin_nodes == tuple(verdict.origin_nodes) and changed.origin_nodes
    assert changed.figures["divergence.nodes"] == len(verdict.diff["tensors"]["nodes"]) > 0
    assert changed.figures["drift.baseline.max_abs_diff"] == verdict.check("drift.baseline").measured["max_abs_diff"] > 0
    assert convnet.nights[CHANGED_DAY + 1].eventful is False  # failing again is no news
    assert convnet.nights[FIXED_DAY].changed == ("quantize",) and convnet.nights[FIXED_DAY].previous_status == "fail"
    assert convnet.nights[1].figures["drift.baseline.max_abs_diff"] == 0.0  # restored: identical to the baseline
    assert convnet.latest.night_id == weeks.tonight.night_id and convnet.latest.status == "pass"
    assert convnet.since().night_id == weeks.nights[FIXED_DAY]
    name, value = CHANGED_ENVIRONMENT
    here = fingerprint()["env"].get(name)
    assert convnet.nights[ENVIRONMENT_DAY].environment == (f"env.{name}: {here!r} -> {value!r}",)
    assert convnet.latest.environment == (f"env.{name}: {value!r} -> {here!r}",)  # tonight runs in this process
    assert [i for i, n in enumerate(convnet.nights) if n.eventful] == [CHANGED_DAY, FIXED_DAY, ENVIRONMENT_DAY, DAYS]
    h200 = summary.series[2]
    assert h200.nights[LOST_DAY].status == "error" and "WorkerCrashedError" in h200.nights[LOST_DAY].error
    assert summary.gpu_types == ("H100", "H200", "none (CPU)")
    assert HistorySummary.from_json(json.loads(json.dumps(summary.to_json()))) == summary


def test_page_is_self_contained_and_tells_what_changed_first(weeks, page):
    html = page.read_text()
    assert html.count("<script") == 1 and "<script src" not in html
    assert not re.search(r'(src|href)="(https?:|file:|/)', html)  # nothing outside the file: links are relative
    verdict = weeks.real.changed["convnet"].verdict
    for key in KEYS:
        assert f"<h3>Nights of <code>{key}</code> on {key.partition('@')[2] or 'none (CPU)'}, newest first</h3>" in html
    for model in ("convnet", "convnet-percentile"):
        assert f'<section data-model="{model}"' in html
    changed_night = weeks.nights[CHANGED_DAY]
    event = re.search(rf"<li[^>]*><span class=\"when\">[^<]*</span> <code>{changed_night}</code>[^\n]*?</li>", html).group(0)
    before = weeks.real.first["convnet"].hashes[-1]["artifact"]["md5"]
    after = weeks.real.changed["convnet"].hashes[-1]["artifact"]["md5"]
    assert f"<b>quantize</b> md5 <code>{before[:10]}</code> → <code>{after[:10]}</code>" in event
    assert "verdict pass → <b>FAIL</b>" in event
    same = re.search(rf'<li data-gpu="H100\|H200"><span class="when">[^<]*</span> <code>{changed_night}</code> \[H100, H200\]: '
                     r"<b>quantize</b> md5 [^\n]*?</li>", html)
    assert same and "(the origin node)" in same.group(0)  # the same change on two GPU types: one item
    assert verdict.origin_nodes == [verdict.first_diverging_node]  # the input's quantization is where it starts
    assert f"first diverging node <code>{escape(verdict.first_diverging_node)}</code> (the origin node)" in event
    # the nights table folds the nights that repeat the night before: 17 passing nights in one row
    assert f"({CHANGED_DAY - 1} nights)</a>" in html
    assert html.count('<td class="md5-changed">') == 2 * 3  # changed and restored, per key
    # a plot per figure, accuracy first; a magnitude (log axis, the model's own units) one plot per model
    figures = ["accuracy.top1", "accuracy.top5", "labels.accuracy", "drift.float.max_abs_diff", "drift.float.max_abs_diff",
               "drift.float.top1_agreement", "drift.baseline.max_abs_diff", "drift.baseline.max_abs_diff",
               "drift.baseline.top1_agreement", "divergence.nodes", "calibration.distinct_md5",
               "entry.seconds"]  # tonight's real night measured its entry's seconds (the replayed nights none)
    assert re.findall(r"\(([a-z0-9_.]+)\)</span></figcaption>", html) == figures
    assert re.findall(r'<figure data-model="([^"]+)"[^>]*><figcaption>[^<]* — \1', html) == ["convnet", "convnet-percentile"] * 2
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="trend"') == len(figures)
    assert html.count('class="md5-changed"') > 0 and "worker was lost 3 time(s)" in html


def test_every_night_report_links_the_history_page(weeks):
    written = history_page_path(weeks.database)
    assert written == weeks.database.with_suffix(".html") and written.is_file()
    assert weeks.tonight.night_id in written.read_text()  # written after tonight was recorded
    report = (weeks.tonight.path / "report.html").read_text()
    link = re.search(r'<a href="([^"]+)">the history page</a>', report).group(1)
    assert (weeks.tonight.path / link).resolve() == written.resolve()
    reports = sorted((weeks.real.folder / "runs").glob("nightly-*/report.html"))
    assert len(reports) == 4  # the fixture's three real nights (their own history) and tonight
    for night in reports:
        if night.parent != weeks.tonight.path:
            assert '<a href="../history.html">the history page</a>' in night.read_text()
    again = CliRunner().invoke(app, ["report", str(weeks.tonight.path), "-o", str(weeks.database.parent / "again.html")])
    assert again.exit_code == 0, again.output
    assert '<a href="weeks.html">the history page</a>' in (weeks.database.parent / "again.html").read_text()


def _classes(dom: str, pattern: str) -> list[str]:
    return re.findall(pattern, dom)


def test_filters_in_a_real_browser(page, tmp_path):
    everything = dump_dom(page.as_uri(), tmp_path)
    assert 'class="off' not in everything
    assert "showing 3 of 3 timelines" in everything
    model = dump_dom(page.as_uri() + "#model=convnet-percentile", tmp_path)
    assert re.search(r'<section data-model="convnet" data-gpu="none \(CPU\)" class="off">', model)
    assert re.search(r'<section data-model="convnet-percentile" data-gpu="H100\|H200"( class="")?>', model)
    assert "showing 2 of 3 timelines" in model
    assert '<option value="convnet-percentile" selected="">' in model
    gpu = dump_dom(page.as_uri() + "#model=convnet-percentile&gpu=H200", tmp_path)
    assert "showing 1 of 3 timelines" in gpu
    assert re.search(r'<div data-gpu="H100" class="off"><h3>Nights of <code>convnet-percentile@H100</code>', gpu)
    assert re.search(r'<div data-gpu="H200"( class="")?><h3>Nights of <code>convnet-percentile@H200</code>', gpu)
    lines = re.findall(r'<g class="f line( off)?" data-model="([^"]+)" data-gpu="([^"]+)"', gpu)
    assert lines and all((off == "") == (gpus == "H200") for off, _, gpus in lines)  # plots: only the H200 line
    overview = re.findall(r'<g class="f( off)?" data-model="([^"]+)" data-gpu="([^"]+)">', gpu)  # "every model"'s rows
    assert [(m, g) for off, m, g in overview if not off] == [("convnet-percentile", "H200")] and len(overview) == 3
    assert '<option value="H200" selected="">' in gpu


# A page that frames the history page and works its selects as a user does, writing what it saw into its own DOM.
HARNESS = """<!DOCTYPE html><html><body><iframe id="page" src="%s"></iframe><script>
document.getElementById('page').addEventListener('load', function () {
  var page = this.contentDocument, seen = [];
  function choose(id, value) {
    var select = page.getElementById(id);
    select.value = value;
    select.dispatchEvent(new Event('change'));
    seen.push(this.contentWindow.location.hash + ' | ' + page.getElementById('filter-count').textContent + ' | '
              + Array.prototype.map.call(page.querySelectorAll('tr.series:not(.off) td:nth-child(2)'), function (td) {
                  return td.textContent; }).join(','));
  }
  choose.call(this, 'filter-model', 'convnet-percentile');
  choose.call(this, 'filter-gpu', 'H100');
  choose.call(this, 'filter-model', '');
  choose.call(this, 'filter-gpu', '');
  var result = document.createElement('pre');
  result.id = 'seen';
  result.textContent = seen.join('\\n');
  document.body.appendChild(result);
});
</script></body></html>"""


def test_the_selects_filter_and_keep_the_choice_in_the_address(page, tmp_path):
    harness = tmp_path / "harness.html"
    harness.write_text(HARNESS % page.as_uri())
    dom = dump_dom(harness.as_uri(), tmp_path, "--allow-file-access-from-files")
    seen = unescape(re.search(r'<pre id="seen">([^<]*)</pre>', dom).group(1)).split("\n")
    assert seen == [
        "#model=convnet-percentile | showing 2 of 3 timelines | H100,H200",
        "#model=convnet-percentile&gpu=H100 | showing 1 of 3 timelines | H100",
        "#gpu=H100 | showing 1 of 3 timelines | H100",
        " | showing 3 of 3 timelines | none (CPU),H100,H200",
    ]


def test_screenshot_shows_status_strips_md5_marks_and_plots(page, tmp_path):
    pixels = screenshot(page.as_uri() + "#model=convnet", tmp_path / "history.png", tmp_path, size="1280,1400")
    assert pixels.std() > 10

    def count(colour: str, region: np.ndarray) -> int:
        rgb = np.array([int(colour[i: i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(region - rgb).max(axis=-1) <= 12).sum())

    # convnet's strips: 26 green cells (and the green banner), 3 red ones, 2 black diamonds (md5 changed), about 21 x 18 px each
    assert pixels.shape[:2] == (1400, 1280)
    assert count(STATUS_COLOURS["pass"], pixels[:60]) > 0.8 * 60 * 1280  # the banner: the latest nights passed
    green = np.abs(pixels[100:] - np.array([0x2E, 0x7D, 0x32])).max(axis=-1) <= 12
    rows = 100 + np.flatnonzero(green.sum(axis=1) > 300)  # rows of strips: mostly green cells
    bands = np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1)
    assert len(bands) == 2  # convnet's row of "every model" (the other models' rows are filtered out) and its own strip
    for rows in bands:
        assert 12 <= len(rows) <= 20  # one row of cells
        band = pixels[rows[0]: rows[-1] + 1]
        assert count(STATUS_COLOURS["pass"], band) > 26 * 250 and count(STATUS_COLOURS["fail"], band) > 3 * 200
        assert count(MARK_COLOUR, band) > 2 * 20  # the md5 diamonds, on the changed and the restored night


def test_page_of_a_filtered_summary(weeks):
    summary = summarize_history(History(weeks.database, read_only=True), models=["convnet-percentile"], gpus=["H200"], nights=10)
    assert [s.key for s in summary.series] == ["convnet-percentile@H200"]
    assert len(summary.nights) == 9  # tonight ran convnet only
    html = render_history(summary)
    assert "convnet-percentile@H200" in html and "convnet-percentile@H100" not in html
    assert {link[0] for link in re.findall(r'href="([^"]*)"', html)} == {"#"}  # no folder, no links to the nights' reports


def _error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {message}\n"


def test_bad_history_inputs_are_one_line_and_exit_2(weeks, tmp_path):
    runner = CliRunner()
    out = tmp_path / "page.html"

    def report(*args):
        return runner.invoke(app, ["report", *map(str, args), "-o", str(out)])

    text = tmp_path / "notes.sqlite"
    text.write_text("not a database")
    _error(report("--history", text), f"{text} is not a qconsist history database (not an SQLite file)")
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(weeks.database.read_bytes()[:100] + b"\x00garbage" * 500)
    _error(report("--history", corrupt), f"cannot open history database {corrupt}: database disk image is malformed")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes(x)")
    _error(report("--history", other), f"{other} is not a qconsist history database (schema version 0, tables: notes); "
                                        "give the file that qconsist nightly writes")
    blank = tmp_path / "blank.sqlite"  # an SQLite file with no table
    with sqlite3.connect(blank) as conn:
        conn.execute("CREATE TABLE x(y)")
        conn.execute("DROP TABLE x")
    _error(report("--history", blank), f"{blank} is not a qconsist history database (schema version 0, tables: none); "
                                        "give the file that qconsist nightly writes")
    empty = tmp_path / "empty.sqlite"
    History(empty)
    _error(report("--history", empty), f"history {empty} holds no model's night yet; run qconsist nightly first")
    _error(report("--history", tmp_path / "missing.sqlite"),
           f"history database {tmp_path / 'missing.sqlite'} does not exist; run qconsist nightly first")
    _error(report("--history", weeks.database, "--model", "resnet"),
           f"no nightly history for model 'resnet' in {weeks.database}; models: convnet, convnet-percentile")
    _error(report("--history", weeks.database, "--gpu", "A10G"),
           f"no night ran on GPU type 'A10G' in {weeks.database}; GPU types: H100, H200, none (CPU)")
    _error(report("--history", weeks.database, "--nights", "0"), "--nights must be a whole number >= 1, got 0")
    _error(report("--history", weeks.database, "--model", "convnet-percentile", "--nights", "1"),
           f"history {weeks.database} holds no night of the models and GPU types asked for in its last 1 night(s); "
           "give more --nights")
    _error(report(weeks.tonight.path, "--history", weeks.database), "give run directories and diff files, or --history, not both")
    _error(report(), "give run directories or diff JSON files to report on, or --history for the history page")
    _error(report(weeks.tonight.path, "--model", "convnet"),
           "--model, --gpu and --nights choose what the history page shows; give --history with them")
    _error(runner.invoke(app, ["report", "--history", str(weeks.database), "-o", str(weeks.database)]),
           f"output {weeks.database} would overwrite the input {weeks.database.resolve()}; choose another file (or --force)")
    assert not out.exists()


def test_history_command_says_a_repeated_reason_once(weeks):
    """Nights that fail for the same reason as the night before name the check instead of repeating it."""
    result = CliRunner().invoke(app, ["history", "convnet", "--history", str(weeks.database)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    reasons = [line for line in lines if line.startswith("      ") and not line.startswith("      error")]
    full = [line for line in reasons if not line.endswith(": as the night before")]
    assert len(full) == len(set(full))  # no reason printed in full twice in a row…
    repeated = [line for line in reasons if line.endswith(": as the night before")]
    assert repeated and all(re.fullmatch(r"      [a-z_.]+: as the night before", line) for line in repeated)
    for index, line in enumerate(lines):  # …and each short one follows a night that gave that check's reason
        if line in repeated:
            check = line.strip().split(":")[0]
            earlier = [text for text in lines[:index] if text.startswith(f"      {check}: ")]
            assert earlier, line
