"""A baseline pipeline run written before xxh3-128 input digests (sha256, names in the manifest) is judged on the
same inputs as a new candidate: its digest is recognised as of another kind, the inputs are digested again the
old way, and only a real change of inputs is reported."""

from __future__ import annotations

import json
from pathlib import Path

from onnx_builders import build_classifier_model
from photo_files import photo
from qconsist.gate import CheckStatus, Policy, evaluate_gate
from qconsist.inputs import Preprocess, open_input_set
from qconsist.pipeline.config import load_pipeline
from qconsist.pipeline.runner import run_pipeline


def _as_written_before(run: Path, folder: Path, changed: bool = False) -> None:
    """The pipeline manifest as qconsist 0.1 wrote it: sha256 digests and names, no sample tables."""
    manifest = json.loads((run / "manifest.json").read_text())
    inputs = open_input_set(folder, Preprocess(resize=(8, 8)), "x")
    for role in ("calibration", "evaluation"):
        recorded = manifest["inputs"][role]
        digest = inputs.digest("sha256")
        recorded.update(names=list(inputs.names), digest=digest[::-1] if changed else digest)
        for key in ("samples", "offset"):
            recorded.pop(key)
        manifest["files"].pop(f"inputs/{role}.jsonl")
        (run / "inputs" / f"{role}.jsonl").unlink()
    (run / "inputs").rmdir()
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_a_baseline_with_sha256_input_digests(tmp_path):
    folder = tmp_path / "photos"
    for n in range(5):
        photo(folder / f"{n}.jpg", n)
    model = build_classifier_model(tmp_path / "m.onnx")
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "{folder}"\n'
                        f'[evaluation]\ndata = "{folder}"\n')
    config = load_pipeline(pipeline)
    old, new = (run_pipeline(config, tmp_path / "runs", run_id=name).path for name in ("old", "new"))
    _as_written_before(old, folder)
    verdict = evaluate_gate(new, old, Policy())
    assert verdict.check("drift.baseline").status is CheckStatus.PASS, verdict.check("drift.baseline").message
    assert verdict.check("artifacts").status is CheckStatus.PASS and verdict.changed_stages == []

    _as_written_before(run_pipeline(config, tmp_path / "runs", run_id="other").path, folder, changed=True)
    verdict = evaluate_gate(new, tmp_path / "runs" / "other", Policy())
    assert verdict.check("drift.baseline").status is CheckStatus.FAIL
    assert verdict.check("drift.baseline").message == ("the evaluation inputs differ from the baseline's (input digests "
                                                       "differ); outputs are not comparable")
