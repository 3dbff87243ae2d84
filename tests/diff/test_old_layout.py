"""Runs written in the per-sample layout (one ``outputs/<sample>.npz`` per sample, 56-byte records in
``dump/fingerprints.npy``: tests/data/old_runs, real runs made by earlier qconsist versions) still read, and
diff against runs of today's layout exactly as two new runs do — but for the tensors ORT holds in NCHWc blocks, which
they recorded as ORT held them and today's runs record in NCHW: those are not compared (``blocked_apart``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from old_runs import copy_old, old_inputs
from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.store.run import Run


RELU_NCHWC = "relu_nchwc (com.microsoft.nchwc:Conv, internal to ORT's optimized graph)"


def _run(made: dict[str, Path], model: str, run_id: str, *extra: str) -> Path:
    result = CliRunner().invoke(app, ["run", str(made[model]), "--inputs", str(made["images"]), "--pipeline",
                                      str(made["pipeline"]), "--dump", *extra, "--runs-dir", "runs", "--run-id", run_id])
    assert result.exit_code == 0, result.output
    return Path("runs") / run_id


def _same_divergence(a, b) -> None:
    assert [(n.label, n.origin, n.samples, n.origin_samples, n.initializers_changed) for n in a.tensors.nodes] == [
        (n.label, n.origin, n.samples, n.origin_samples, n.initializers_changed) for n in b.tensors.nodes]
    assert (a.outputs.differing_samples, a.outputs.greatest_abs, a.outputs.top1_agree) == (
        b.outputs.differing_samples, b.outputs.greatest_abs, b.outputs.top1_agree)


def test_an_old_run_diffs_against_a_new_one_as_two_new_runs_do(tmp_path):
    made = old_inputs(tmp_path / "work")
    old_a, old_b = copy_old("v1570-a", Path("runs")), copy_old("v1570-b", Path("runs"))
    new_a, new_b = _run(made, "model", "new-a", "--raw", "all"), _run(made, "variant", "new-b")
    assert Run.open(old_a).inference.output_format == "qconsist.outputs/1"
    assert Run.open(new_a).inference.output_format == "qconsist.outputs/2"
    # the same model on the same inputs, one run old and one new: identical at every level compared
    same = diff_runs(old_a, new_a)
    # its NCHWc Conv (blocks of 16 here) was recorded as ORT held it then, in NCHW now: not compared (issue 28)
    assert same.tensors.blocked_apart == [RELU_NCHWC]
    assert same.passed and same.tensors.compared == 5 and same.outputs.samples == 8 and same.outputs.identical
    assert same.artifacts.first_differing_stage is None and same.accuracy.flipped_count == 0
    # the old run's accuracy, from its stored outputs and its sample table's labels, is the new run's record
    assert same.accuracy.a == same.accuracy.b == Run.open(new_a).inference.accuracy
    # the classifier against its variant (another fc bias): old against new, new against new, old against old
    fresh, across, back, old = (diff_runs(new_a, new_b), diff_runs(old_a, new_b), diff_runs(new_b, old_a),
                                diff_runs(old_a, old_b))
    assert [n.label for n in fresh.tensors.nodes] == ["fc", "softmax"] and fresh.tensors.origins[0].label == "fc"
    for result in (across, old):
        _same_divergence(result, fresh)
    assert [n.label for n in back.tensors.nodes] == ["fc", "softmax"]
    assert across.accuracy.flipped == fresh.accuracy.flipped and across.accuracy.a == fresh.accuracy.a
    assert old.accuracy is None  # neither old run recorded its class-scores output, and their models are gone
    outputs = Run.open(old_a).outputs()
    stored = np.stack([np.load(old_a / "outputs" / f"{i:06d}.npz")["o0"] for i in range(8)])
    assert outputs.block(0, 8)[0].tobytes() == stored.tobytes()
    out = CliRunner().invoke(app, ["diff", str(old_a), str(new_b)])
    assert out.exit_code == 1 and "first diverging node: fc" in out.stdout


def test_an_old_run_with_sha256_digests_diffs_against_a_new_one(tmp_path):
    """A run of qconsist 6fe134f (sha256 input digests, sample names in its manifest, no labels) against a new
    run of the same images: their names are compared, then everything else as usual."""
    made = old_inputs(tmp_path / "work-flat", flat=True)
    old = copy_old("v6fe-a", Path("runs"))
    new = _run(made, "model", "new")
    result = diff_runs(old, new)
    assert result.passed and result.tensors.compared == 5 and result.outputs.samples == 8
    assert result.tensors.blocked_apart == [RELU_NCHWC]
    assert result.notes == ["the runs record sha256 and xxh3-128 input digests (one was written before qconsist 0.2): "
                            "their 8 sample names agree, their bytes were not compared"]
    assert result.accuracy is None  # no labels
