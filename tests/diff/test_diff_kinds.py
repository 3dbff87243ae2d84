"""``diff`` judges each final output for what it is (issue 27 item 6), as the pipeline and the gate do: a class
output gets a per-sample top-1 agreement, a sequence (a map whose class axis the graph gives) a per-position one,
and the first output is never judged by a top-1 because it is first."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from judge_models import sequence_and_class
from onnx_builders import save_arrays
from qconsist.cli import app


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("kinds")
    models = {"a": sequence_and_class(folder / "a.onnx"), "b": sequence_and_class(folder / "b.onnx", shift=0.2)}
    arrays = save_arrays(folder / "x.npy", 16, seed=4, shape=(8,))
    for key, model in models.items():
        out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(arrays), "--runs-dir", str(folder / "runs"),
                                       "--run-id", key])
        assert out.exit_code == 0, out.output
    return folder, models, arrays


def _independent(models, arrays) -> tuple[float, int, float]:
    """numpy on onnxruntime's outputs: per-position agreement of seq, per-sample agreement of prob."""
    x = np.load(arrays)
    sessions = [ort.InferenceSession(str(models[k]), providers=["CPUExecutionProvider"]) for k in ("a", "b")]
    got = [[s.run(None, {"x": x[i:i + 1]}) for i in range(len(x))] for s in sessions]
    positions = [(a[0].argmax(-1) == b[0].argmax(-1)) for a, b in zip(*got)]
    classes = [a[1].argmax() == b[1].argmax() for a, b in zip(*got)]
    return float(np.mean(positions)), int(np.sum([p.size for p in positions])), float(np.mean(classes))


def test_diff_judges_a_sequence_per_position_and_class_scores_per_sample(pair):
    folder, models, arrays = pair
    positions, count, classes = _independent(models, arrays)
    assert (positions, count, classes) == (0.8625, 80, 1.0)  # and the flat arg-max of seq agrees on 13/16 = 81.2%
    out = CliRunner().invoke(app, ["diff", str(folder / "runs" / "a"), str(folder / "runs" / "b")])
    assert out.exit_code == 1, out.output
    lines = out.stdout.splitlines()
    start = lines.index("final outputs: 16/16 samples differ, greatest abs difference 0.332147")
    assert lines[start + 1:start + 3] == [
        "  seq (map): SQNR 14.3 dB, cosine 0.98146, greatest difference 0.3321, per-position top-1 agreement 86.2% of 80 positions",
        "  prob (class-scores): identical in 16 samples",
    ]
    assert "top-1 agreement 81.2%" not in out.stdout
    data = json.loads(CliRunner().invoke(app, ["diff", "--json", str(folder / "runs" / "a"), str(folder / "runs" / "b")]).stdout)
    judged = {entry["label"]: entry for entry in data["judged"]}
    assert judged["seq"]["position_agreement"] == positions and judged["seq"]["class_axis"] == 2
    assert judged["seq"]["top1_agreement"] is None and judged["prob"]["top1_agreement"] == classes
    assert data["outputs"]["top1_agreement"] is None  # no top-1 of "the first output"
