"""Pages worth opening: a run's page states its run, verdict, checks and SQNR; two runs on one page each say
which they are; a diff's page names runs A and B and what differed, in words and formatted figures, and marks
the bars that are lower bounds; the history's ticks read apart. Rendered in headless Chromium too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from browser import screenshot
from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.report.html import FAIL_COLOUR, PASS_COLOUR
from qconsist.report.svg import date_labels

PIPELINE = ('name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\ndata = "arrays.npy"\ncount = 8\nrepeat = 2\n'
            '[evaluation]\ndata = "arrays.npy"\noffset = 8\n')


def _invoke(*args, code: int = 0) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pages")
    build_classifier_model(folder / "cls.onnx")
    save_arrays(folder / "arrays.npy", 12, seed=2)
    (folder / "cls.toml").write_text(PIPELINE)
    (folder / "floor.toml").write_text(PIPELINE + "[quantize]\nmin_sqnr_db = 60\n")
    runs = folder / "runs"
    _invoke("pipeline", "run", folder / "cls.toml", "--runs-dir", runs, "--run-id", "cls")
    _invoke("pipeline", "run", folder / "floor.toml", "--runs-dir", runs, "--run-id", "floor", code=1)
    for level in ("disable", "all"):
        _invoke("run", runs / "cls", "--inputs", folder / "arrays.npy", "--level", level, "--dump", "--runs-dir", runs,
                "--run-id", f"level-{level}")
    (runs / "diff.json").write_text(_invoke("diff", runs / "level-disable", runs / "level-all", "--json", code=1))
    return runs


def _page(runs: Path, *items: str) -> str:
    out = runs.parent / f"{'-'.join(Path(i).stem for i in items)}.html"
    _invoke("report", *(runs / i for i in items), "-o", out, "--force")
    return out.read_text()


def _text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html.split("<body>", 1)[1]).split())


def test_a_pipeline_run_page_states_its_run_verdict_checks_and_sqnr(runs):
    html = _page(runs, "cls")
    text = _text(html)
    assert '<div class="banner pass" id="verdict">PASS — pipeline run cls<small>model cls: 4 checks passed, 2 calibrations agree</small></div>' in html
    sqnr = json.loads((runs / "cls" / "manifest.json").read_text())["stages"][2]["checks"]["outputs_vs_optimize"]["judged"][0]["sqnr_db"]
    assert f"SQNR vs the float model prob {sqnr:.1f} dB" in text
    assert "convert onnx checker passed" in text and "convert onnxruntime load passed" in text
    assert "optimize outputs vs convert passed greatest abs difference 0 within atol 1e-05 + rtol 0.0001·|a| on 4 evaluation inputs" in text
    assert (f"quantize outputs vs optimize, floor 15 dB SQNR passed prob (class-scores): SQNR {sqnr:.1f} dB, cosine ") in text
    assert "Repeated calibration 2 calibrations agree: md5 " in text
    assert "calibration inputs arrays.npy" not in text and "calibration inputs " in text


def test_a_failing_run_page_says_what_failed(runs):
    html = _page(runs, "floor")
    assert ('<div class="banner fail" id="verdict">FAIL — pipeline run floor<small>model cls: failed: quantize outputs vs '
            "optimize, floor 60 dB SQNR</small></div>") in html
    assert '<td>quantize</td><td>outputs vs optimize, floor 60 dB SQNR</td><td class="status-fail">FAILED</td>' in html


def test_two_runs_on_one_page_say_which_is_which(runs):
    html = _page(runs, "level-disable", "level-all")
    text = _text(html)
    for level in ("disable", "all"):
        assert f'<div class="banner pass" id="verdict">inference run level-{level}<small>cls: dump faithful</small></div>' in html
        assert f"execution provider cpu; level {level}" in text
    assert html.count(f"<th>model</th><td><code>{runs / 'cls'}</code>, stage quantize</td>") == 2
    assert "Artifacts" not in text  # not the source pipeline's artifacts twice


def test_a_diff_page_names_its_runs_what_differed_and_formats_figures(runs):
    diff = json.loads((runs / "diff.json").read_text())
    html = _page(runs, "diff.json")
    text = _text(html)
    assert ('<div class="banner fail" id="verdict">FAIL — diff A level-disable vs B level-all — differing in '
            "graph_optimization_level: disable → all: diverged<small>") in html
    assert f"run A {runs / 'level-disable'} run B {runs / 'level-all'}" in text
    assert "greatest_abs" not in text and "identical False" not in text and "top1_agreement" not in text
    final = diff["outputs"]
    assert f"greatest |difference| {final['greatest_abs']:.4g}" in text
    assert f"bit-identical {'yes' if final['identical'] else 'no'}" in text
    nodes = diff["tensors"]["nodes"]
    exact = [n for n in nodes if (n.get("elements") or {}).get("max_abs") is not None]
    assert f"{len(exact)} exact from raw tensors (solid), {len(nodes) - len(exact)} a lower bound" in text
    drawn = len(re.findall(r'<rect class="bar lower-bound"', html))
    assert 0 < drawn <= len(nodes) - len(exact)  # a lower bound of 0 draws no bar
    assert html.count('class="bar"') + drawn == len(re.findall(r'<rect class="bar', html))


def test_pages_in_a_browser(runs, tmp_path):
    for items, colour in ((("cls",), PASS_COLOUR), (("floor",), FAIL_COLOUR), (("diff.json",), FAIL_COLOUR)):
        _page(runs, *items)
        page = runs.parent / f"{'-'.join(Path(i).stem for i in items)}.html"
        pixels = screenshot(page, tmp_path / "page.png", tmp_path, size="1400,900")
        banner = pixels[5:50, :, :]
        target = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
        assert (np.abs(banner - target).sum(axis=2) < 30).mean() > 0.7, items
        assert pixels[100:, :, :].std() > 10  # the page below the banner is not blank


def test_history_ticks_read_apart():
    stamps = ["2026-11-25T02:00:00Z", "2026-11-26T02:00:00Z", "2026-11-26T09:30:00Z", "2026-11-26T17:05:00Z",
              "2026-11-26T23:40:00Z", "2026-11-27T02:00:00Z"]
    assert date_labels(stamps, range(6)) == {0: "11-25", 1: "11-26 02:00", 2: "11-26 09:30", 3: "11-26 17:05",
                                             4: "11-26 23:40", 5: "11-27"}
    assert date_labels(stamps, [0, 2, 5]) == {0: "11-25", 2: "11-26", 5: "11-27"}
