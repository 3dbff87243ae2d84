"""``diff`` of two labelled runs: both runs' accuracy, the samples whose prediction flipped, and for each the first
diverging node and the origin in that sample — checked against the stored outputs with numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from old_runs import old_inputs
from qconsist.cli import app
from qconsist.diff import DiffResult, diff_runs
from qconsist.store.run import Run
from qconsist.store.serde import loads


def _run(made: dict[str, Path], model: str, run_id: str, *extra: str) -> Path:
    result = CliRunner().invoke(app, ["run", str(made[model]), "--inputs", str(made["images"]), "--pipeline",
                                      str(made["pipeline"]), "--runs-dir", "runs", "--run-id", run_id, *extra])
    assert result.exit_code == 0, result.output
    return Path("runs") / run_id


def test_flipped_predictions_are_named_with_their_origin(tmp_path):
    made = old_inputs(tmp_path / "work")
    a, b = _run(made, "model", "a", "--dump"), _run(made, "variant", "b", "--dump", "--batch-size", "1")
    labels = np.array([int(Path(n).parent.name[-1]) for n in sorted(str(p.relative_to(made["images"]))
                                                                      for p in made["images"].rglob("*.png"))])
    scores = {key: np.load(run / "outputs" / "o0.npy").reshape(8, 5) for key, run in (("a", a), ("b", b))}
    flipped = np.flatnonzero(scores["a"].argmax(axis=1) != scores["b"].argmax(axis=1))
    assert flipped.size  # the variant's bias moves some predictions
    result = diff_runs(a, b)
    change = result.accuracy
    assert change.output == "prob" and change.flipped_count == flipped.size
    assert [f.sample for f in change.flipped] == flipped.tolist()
    for key, side in (("a", change.a), ("b", change.b)):
        right = int((scores[key].argmax(axis=1) == labels).sum())
        assert (side.labelled, side.top1, side.top5) == (8, right, None)  # 5 classes: no top-5
        assert Run.open(a if key == "a" else b).inference.accuracy == side  # what run recorded
    for flip in change.flipped:
        assert (flip.first, flip.origins) == ("fc", ["fc"])
        assert (flip.class_a, flip.class_b, flip.label) == (int(scores["a"][flip.sample].argmax()),
                                                           int(scores["b"][flip.sample].argmax()), int(labels[flip.sample]))
    share_a, share_b = change.a.top1 / 8, change.b.top1 / 8
    assert change.summary() == (f"accuracy {100 * share_a:.2f}% -> {100 * share_b:.2f}% ({100 * (share_b - share_a):+.2f} "
                                f"points): {flipped.size} predictions flipped; origin fc (the models differ)")
    out = CliRunner().invoke(app, ["diff", str(a), str(b)])
    assert out.exit_code == 1
    assert change.summary() in out.stdout
    first = change.flipped[0]
    assert f"  sample {first.sample} ({first.name}, label {first.label}): class {first.class_a} -> {first.class_b}; " \
           "first diverging node fc; origin fc" in out.stdout
    data = loads(CliRunner().invoke(app, ["diff", "--json", str(a), str(b)]).stdout)
    assert data["accuracy"]["flipped_count"] == flipped.size and DiffResult.from_json(data).accuracy == change


def test_without_dumps_the_flips_are_counted_and_the_way_to_their_origin_said(tmp_path):
    made = old_inputs(tmp_path / "work")
    a, b = _run(made, "model", "a"), _run(made, "variant", "b")
    change = diff_runs(a, b).accuracy
    assert change.flipped_count and all(f.first is None and f.origins == [] for f in change.flipped)
    assert change.summary().endswith("predictions flipped (the models differ; dump both runs with --dump "
                                     "to name the node behind them)")
    same = diff_runs(a, _run(made, "model", "again"))
    assert same.accuracy.summary() == (f"accuracy {100 * same.accuracy.a.top1 / 8:.2f}% -> "
                                       f"{100 * same.accuracy.a.top1 / 8:.2f}% (+0.00 points): no prediction flipped")
