"""HTML reports, rendered in a real headless browser (Debian chromium) and checked pixel by pixel.

A small conv net built in code (``onnx_builders.small_convnet``) runs two nightlies; between them one calibration sample changes, so the second
night's gate fails with a real divergence whose report is rendered and screenshotted.
"""

from __future__ import annotations

import re
import shutil
from html import escape
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from browser import screenshot
from nightly_files import convnet_nightly
from qconsist.cli import app
from qconsist.nightly import load_nightly, run_nightly
from qconsist.report import render_paths
from qconsist.report.html import FAIL_COLOUR, PASS_COLOUR
from qconsist.report.svg import BAR_COLOUR, ORIGIN_COLOUR


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report-nightly")
    config = convnet_nightly(folder)
    first = run_nightly(load_nightly(config))
    calibration = np.load(folder / "calibration.npy")
    calibration[2] *= 4.0  # one calibration input changes
    np.save(folder / "calibration.npy", calibration)
    second = run_nightly(load_nightly(config))
    return first, second


def _rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)


def _share(pixels: np.ndarray, colour: str, tolerance: int = 12) -> float:
    return float((np.abs(pixels - _rgb(colour)).max(axis=-1) <= tolerance).mean())


def test_second_night_fails_with_a_real_divergence(two_nights):
    first, second = two_nights
    assert first.passed and first.entries[0].verdict.check("artifacts").status.value == "not_applicable"
    verdict = second.entries[0].verdict
    assert not verdict.passed
    assert verdict.changed_stages == ["quantize"]
    assert verdict.first_diverging_node is not None
    assert verdict.diff["tensors"]["first"] == verdict.first_diverging_node


def test_report_is_self_contained_and_names_the_divergence(two_nights):
    _, second = two_nights
    html = (second.path / "report.html").read_text()
    verdict = second.entries[0].verdict
    assert "<script" not in html.lower()
    assert not re.search(r'(src|href)="(https?:|file:|/)', html)  # nothing outside the file
    assert f"Divergence starts at <code>{escape(verdict.first_diverging_node)}</code>" in html
    assert '<td>artifacts</td><td class="status-fail">fail</td><td>stage &#x27;quantize&#x27; changed' in html
    assert html.count("stage &#x27;quantize&#x27; changed (md5") == 1  # each reason once: in its check's row
    assert "1 check(s) failed: <b>artifacts</b>" in html or "2 check(s) failed: <b>artifacts</b>" in html
    assert "<svg" in html and 'class="bar' in html and 'class="origin"' in html
    assert "Not measured: execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime" in html  # the GPU matrix says why it is empty


def test_failed_night_screenshot_shows_verdict_plot_and_origins(two_nights, tmp_path):
    _, second = two_nights
    pixels = screenshot(second.path / "report.html", tmp_path / "night.png", tmp_path)
    assert pixels.shape[0] >= 2000 and pixels.std() > 10  # not blank
    assert _share(pixels[5:50, :, :], FAIL_COLOUR) > 0.75  # the red FAIL banner across the top (white text on it)
    assert _share(pixels[120:, :, :], FAIL_COLOUR) < 0.05  # …and only there
    assert _share(pixels, BAR_COLOUR) > 0.002  # the divergence bars
    assert _share(pixels, ORIGIN_COLOUR) * pixels.shape[0] * pixels.shape[1] >= 40  # at least one origin diamond
    shutil.copy(tmp_path / "night.png", Path(second.path) / "report.png")  # kept beside the report for a look


def test_passing_entry_screenshot_is_green(two_nights, tmp_path):
    first, _ = two_nights
    entry = Path(first.entries[0].entry_run)
    pixels = screenshot(entry / "report.html", tmp_path / "entry.png", tmp_path, size="1024,900")
    assert _share(pixels[5:50, :, :], PASS_COLOUR) > 0.75
    assert _share(pixels, FAIL_COLOUR) < 0.001


def test_report_command_on_runs_and_diff(two_nights, tmp_path):
    _, second = two_nights
    entry = Path(second.entries[0].entry_run)
    diff_file = tmp_path / "diff.json"
    import json

    diff_file.write_text(json.dumps(second.entries[0].verdict.diff))
    pipeline = Path(second.entries[0].pipeline_run)
    out = tmp_path / "all.html"
    result = CliRunner().invoke(app, ["report", str(entry), str(pipeline), str(diff_file), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert html.count('<div class="banner') == 3
    assert "FAIL — diff A " in html and ": diverged" in html and "PASS — pipeline run " in html


def test_report_errors(tmp_path):
    bogus = tmp_path / "x.json"
    bogus.write_text('{"a": 1}')
    result = CliRunner().invoke(app, ["report", str(bogus), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert result.stderr == (f"error: {bogus} is not a `qconsist diff --json` or `qconsist sensitivity --json` result "
                             "(no 'tensors', no schema qconsist.sensitivity/1)\n")
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "-o", str(tmp_path / "r.html")])
    assert missing.exit_code == 2
    assert missing.stderr == f"error: run directory {tmp_path / 'run'} does not exist\n"
    with pytest.raises(Exception, match="give at least one run directory"):
        render_paths([])


def test_gpu_matrix_section_lists_latencies_and_the_recommendation(tmp_path):
    """The GPU part of a report, from a locate report with D's own decision logic."""
    from qconsist.locate.decision import ConfigOutcome, recommend
    from qconsist.locate.latency import LatencyStats
    from qconsist.locate.repeats import RepeatOutcome
    from qconsist.locate.config import Tf32Override
    from qconsist.locate.report import ConfigReport, LocateReport, SensitiveNode, Tf32Section
    from qconsist.report.html import gpu_section

    measured = {"EXHAUSTIVE/tf32=1": (2.10, False), "EXHAUSTIVE/tf32=0": (2.30, True),
                "HEURISTIC/tf32=0": (2.31, True), "DEFAULT/tf32=0": (6.60, True)}
    outcomes = [ConfigOutcome(label, stable, median, label.startswith("EXHAUSTIVE"), False)
                for label, (median, stable) in measured.items()]
    recommendation = recommend(outcomes, max_cost=1.15)

    def config(label: str, median: float, stable: bool) -> ConfigReport:
        latency = LatencyStats(0.0, median, 5, 30, median, median * 0.99, median * 1.01, median, median)
        repeat = RepeatOutcome(label, "quiet", 4, () if stable else (1,), ())
        return ConfigReport(label, {}, latency, {}, (repeat,))

    locate = LocateReport(
        model={}, inputs={}, device={}, reference="EXHAUSTIVE/tf32=1", repeats=4, contention=None,
        configs=[config(label, median, stable) for label, (median, stable) in measured.items()], comparisons=[], tf32=Tf32Section(Tf32Override(None)),
        recommendation=recommendation,
        nodes=[SensitiveNode("conv_stage0_block0_branch2a", "Conv", "algorithm", (), 1, 1, 0.5, 0)],
    )
    html = gpu_section(locate, None)
    assert html.count("<tr>") == 5
    assert f"<code>{recommendation.config}</code> ★ recommended" in html
    assert recommendation.config == "EXHAUSTIVE/tf32=0"  # fastest bit-stable
    assert "<td>6.6</td>" in html and "conv_stage0_block0_branch2a</code> (algorithm)" in html
    assert "Not measured" in gpu_section(None, "no CUDA GPU") and "no CUDA GPU" in gpu_section(None, "no CUDA GPU")


def test_gate_cli_on_nightly_entries(two_nights, tmp_path):
    first, second = two_nights
    junit = tmp_path / "junit.xml"
    result = CliRunner().invoke(app, [
        "gate", second.entries[0].entry_run, "--baseline", first.entries[0].entry_run,
        "--policy", str(Path(second.config).parent / "policy.toml"), "--junit", str(junit)])
    assert result.exit_code == 1, result.output
    verdict = second.entries[0].verdict
    assert f"first diverging node: {verdict.first_diverging_node}" in result.output
    assert "FAIL           artifacts: stage 'quantize' changed" in result.output
    assert 'name="drift.baseline"' in junit.read_text()
    # an entry as its own baseline: every baseline check passes by construction, so the gate fails saying so
    same = CliRunner().invoke(app, ["gate", first.entries[0].entry_run, "--baseline", first.entries[0].entry_run])
    assert same.exit_code == 1, same.output
    assert [line.split(":")[0] for line in same.output.splitlines() if line.startswith("  FAIL")] == ["  FAIL           baseline"]
    assert "PASS           inference.repeat: two dumped inferences are bit-identical" in same.output
