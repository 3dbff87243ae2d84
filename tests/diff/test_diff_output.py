"""diff's output for CI logs and copy-paste: through a real pipe nothing is wrapped or cut, and the command
it prints to capture raw tensors runs as printed and gives runs that diff with element statistics."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from qconsist.diff import diff_runs

BIN = Path(sys.executable).parent


def _qconsist(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "40"}
    return subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)


@pytest.fixture(scope="module")
def photo_runs(nsfw_run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The quantized open_nsfw model *file* run on package photos 2..3 (preprocessed as the pipeline says) at
    levels disable and all, dumped without raw tensors."""
    from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline

    runs = tmp_path_factory.mktemp("photo-runs")
    source = resolve_model(nsfw_run.path / "quantize" / "model.onnx")
    photos = open_input_set("package:photos", load_pipeline(Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml").preprocess,
                            input_specs(source.path)[0].name).subset(2, 2)
    return {level: run_inference(source, photos, RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True),
                                 runs, run_id=level).run_dir for level in ("disable", "all")}


def test_piped_diff_shows_full_node_names_unwrapped(photo_runs, tmp_path):
    result = diff_runs(photo_runs["disable"], photo_runs["all"])
    shown = [n.label for n in result.tensors.nodes[:12]]
    assert max(map(len, shown)) >= 27  # e.g. conv_stage0_block0_branch2a: cut to "conv_s…" at 80 columns before
    out = _qconsist(["qconsist", "diff", str(photo_runs["disable"]), str(photo_runs["all"])], tmp_path)
    assert out.returncode == 1, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("│")]
    for label in shown:  # each node's row holds its full name and its kind on one line
        assert any(line.split("│")[1].strip() == label and line.split("│")[3].strip() in ("origin", "span", "propagates")
                   for line in rows), label
    assert not any("…" in line for line in rows)  # no name cut (the line saying how many rows were left out has one)
    assert all(len(line) > 100 for line in rows)  # COLUMNS=40 does not apply to a pipe


def test_suggested_capture_command_runs_as_printed(photo_runs, tmp_path):
    result = diff_runs(photo_runs["disable"], photo_runs["all"])
    assert result.tensors.raw_missing and len(result.capture) == 2
    first = result.tensors.first
    assert result.capture[0] == (
        f"qconsist run {photo_runs['disable'].resolve()} --stage model --inputs package:photos --ep cpu --level disable "
        f"--offset 2 --count 2 --dump --raw {','.join(result.tensors.raw_missing)}"
    )
    captured = []
    for command, run_id in zip(result.capture, ("captured-a", "captured-b")):
        out = _qconsist([*shlex.split(command), "--run-id", run_id], tmp_path)
        assert out.returncode == 0, out.stderr
        captured.append(tmp_path / "runs" / run_id)
    # the captured runs are the runs diffed, on the same samples: bit-identical to them ...
    assert diff_runs(photo_runs["disable"], captured[0]).passed
    assert diff_runs(photo_runs["all"], captured[1]).passed
    # ... and, with their raw tensors, diff gives the element statistics it asked them for
    again = diff_runs(captured[0], captured[1])
    assert again.capture == [] and again.tensors.raw_missing == []
    node = next(n for n in again.tensors.nodes if n.key == first.key)
    assert node.elements is not None and node.elements.differing > 0
