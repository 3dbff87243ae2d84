"""HTML reports, rendered in a real headless browser (Debian chromium) and checked pixel by pixel.

A small conv net built here runs two nightlies; between them one calibration sample changes, so the second
night's gate fails with a real divergence whose report is rendered and screenshotted.
"""

from __future__ import annotations

import re
import shutil
from html import escape
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.nightly import load_nightly, run_nightly
from qconsist.report import render_paths
from qconsist.report.html import FAIL_COLOUR, PASS_COLOUR
from qconsist.report.svg import BAR_COLOUR, ORIGIN_COLOUR

CHROMIUM = "/usr/bin/chromium"


def small_convnet(path: Path) -> None:
    """Conv → Relu → Conv → Relu → GlobalAveragePool → Flatten → Gemm → Softmax, weights seeded."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b2"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 4)).astype(np.float32), "w3"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b3"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "small_convnet", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_nightly(folder: Path) -> Path:
    small_convnet(folder / "convnet.onnx")
    rng = np.random.default_rng(11)
    np.save(folder / "calibration.npy", rng.normal(0, 1, (4, 3, 16, 16)).astype(np.float32))
    np.save(folder / "evaluation.npy", rng.normal(0, 1, (3, 3, 16, 16)).astype(np.float32))
    (folder / "policy.toml").write_text("[drift.float]\nmax_abs_diff = 0.2\nmin_top1_agreement = 0.6\n")
    config = folder / "nightly.toml"
    config.write_text(
        'runs_dir = "runs"\npolicy = "policy.toml"\n[[models]]\nname = "convnet"\n'
        '[models.pipeline.model]\nonnx = "convnet.onnx"\n'
        '[models.pipeline.calibration]\ndata = "calibration.npy"\nrepeat = 2\n'
        '[models.pipeline.quantize]\nper_channel = true\n'
        '[models.pipeline.evaluation]\ndata = "evaluation.npy"\n'
    )
    return config


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report-nightly")
    config = write_nightly(folder)
    first = run_nightly(load_nightly(config))
    calibration = np.load(folder / "calibration.npy")
    calibration[2] *= 4.0  # one calibration input changes
    np.save(folder / "calibration.npy", calibration)
    second = run_nightly(load_nightly(config))
    return first, second


def screenshot(html_file: Path, png: Path, tmp_path: Path, size: str = "1280,2000") -> np.ndarray:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install -y chromium)")
    profile = tmp_path / "chromium-profile"
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={size}", html_file.resolve().as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return np.asarray(Image.open(png).convert("RGB")).astype(np.int16)


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
    assert "artifacts: stage &#x27;quantize&#x27; changed" in html
    assert "<svg" in html and 'class="bar"' in html and 'class="origin"' in html
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
    assert "diff diff: diverged" in html and "pipeline run" in html


def test_report_errors(tmp_path):
    bogus = tmp_path / "x.json"
    bogus.write_text('{"a": 1}')
    result = CliRunner().invoke(app, ["report", str(bogus), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert result.stderr == f"error: {bogus} is not a `qconsist diff --json` result (no 'tensors')\n"
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "-o", str(tmp_path / "r.html")])
    assert missing.exit_code == 2
    assert missing.stderr == f"error: run directory {tmp_path / 'run'} does not exist\n"
    with pytest.raises(Exception, match="give at least one run directory"):
        render_paths([])


def test_gpu_matrix_section_lists_latencies_and_the_recommendation(tmp_path):
    """The GPU part of a report, from a locate report's JSON shape with D's own decision logic."""
    from qconsist.gpu.decision import ConfigOutcome, recommend
    from qconsist.report.html import gpu_section

    measured = {"EXHAUSTIVE/tf32=1": (2.10, False), "EXHAUSTIVE/tf32=0": (2.30, True),
                "HEURISTIC/tf32=0": (2.31, True), "DEFAULT/tf32=0": (6.60, True)}
    outcomes = [ConfigOutcome(label, stable, median, label.startswith("EXHAUSTIVE"), False)
                for label, (median, stable) in measured.items()]
    recommendation = recommend(outcomes, max_cost=1.15)
    locate = {
        "configs": [{"label": label, "stable": stable, "latency": {"median_ms": median, "spread": 0.02}}
                    for label, (median, stable) in measured.items()],
        "recommendation": recommendation.to_json(),
        "nodes": [{"label": "conv_stage0_block0_branch2a", "why": "algorithm"}],
    }
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
