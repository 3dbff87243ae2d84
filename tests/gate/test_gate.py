"""The gate on real open_nsfw pipeline runs, with figures checked against an independent computation."""

from __future__ import annotations

import json
import shutil
from xml.etree import ElementTree as ET

import numpy as np
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import ConfigError, RunStoreError
from qconsist.gate import CheckStatus, Policy, evaluate_gate, parse_policy
from qconsist.inputs.photos import package_photos
from qconsist.inputs.preprocess import ChannelOrder, Preprocess


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


def _outputs(model_path):
    """Final outputs on evaluation photos 12 and 13, computed here without qconsist's evaluation code."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    pre = Preprocess(resize=(256, 256), crop=(224, 224), channel_order=ChannelOrder.BGR, mean=(104.0, 117.0, 123.0))
    name = session.get_inputs()[0].name
    return np.stack([session.run(None, {name: pre.apply(p)})[0] for p in package_photos()[12:14]])


def test_identical_rebuild_passes(gate_runs):
    verdict = evaluate_gate(gate_runs["same"], gate_runs["baseline"], Policy())
    assert verdict.passed, verdict.reasons
    assert verdict.changed_stages == []
    statuses = {c.name: c.status for c in verdict.checks}
    assert statuses == {
        "artifacts": CheckStatus.PASS, "calibration.repeat": CheckStatus.PASS, "calibration.params": CheckStatus.PASS,
        "inference.repeat": CheckStatus.PASS, "outputs.finite": CheckStatus.PASS, "drift.float": CheckStatus.PASS,
        "drift.baseline": CheckStatus.PASS, "labels.accuracy": CheckStatus.NOT_APPLICABLE, "environment": CheckStatus.PASS,
        "gpu.pinned": CheckStatus.NOT_APPLICABLE,
    }
    # the float drift is the real one, measured independently, and recorded with its tolerance
    expected = float(np.abs(_outputs(gate_runs["same"] / "quantize/model.onnx") - _outputs(gate_runs["same"] / "optimize/model.onnx")).max())
    drift = verdict.check("drift.float")
    assert drift.measured["max_abs_diff"] == pytest.approx(expected, rel=1e-6) and expected > 0
    assert drift.tolerance == {"max_abs_diff": None, "min_top1_agreement": 0.9, "min_sqnr_db": 15.0, "rtol": 0.0}
    assert verdict.check("drift.baseline").measured["max_abs_diff"] == 0.0
    assert "no baseline" not in verdict.check("artifacts").message
    assert verdict.check("gpu.pinned").message.startswith("no GPU recommendation to enforce")


def test_recalibrated_model_fails_naming_the_quantize_stage(gate_runs):
    verdict = evaluate_gate(gate_runs["other"], gate_runs["baseline"], Policy())
    assert not verdict.passed
    assert verdict.changed_stages == ["quantize"]  # convert and optimize are unchanged
    reasons = "\n".join(verdict.reasons)
    assert "artifacts: stage 'quantize' changed (md5 " in reasons
    assert "calibration inputs (digest differs)" in reasons
    assert "not expected by the policy (expect_changed = [])" in reasons
    expected = float(np.abs(_outputs(gate_runs["other"] / "quantize/model.onnx") - _outputs(gate_runs["baseline"] / "quantize/model.onnx")).max())
    baseline_drift = verdict.check("drift.baseline")
    assert baseline_drift.status is CheckStatus.FAIL and expected > 0
    assert baseline_drift.measured["max_abs_diff"] == pytest.approx(expected, rel=1e-6)
    assert "Mismatched elements: " in baseline_drift.message
    # no dumps on plain pipeline runs: the gate says where the first diverging node comes from
    assert "first diverging node unknown (no inference runs with dumps on both sides" in baseline_drift.message


def test_expected_change_and_loose_baseline_tolerance_pass(gate_runs):
    policy = parse_policy('[artifacts]\nexpect_changed = ["quantize"]\n'
                          '[drift.baseline]\nmax_abs_diff = 0.5\nmin_top1_agreement = 0.5\n')
    verdict = evaluate_gate(gate_runs["other"], gate_runs["baseline"], policy)
    assert verdict.passed, verdict.reasons
    assert "; expected by the policy" in verdict.check("artifacts").message
    assert verdict.policy["drift"]["baseline"] == {"max_abs_diff": 0.5, "min_top1_agreement": 0.5, "min_sqnr_db": None}


def test_first_release_has_nothing_to_compare(gate_runs):
    verdict = evaluate_gate(gate_runs["baseline"], None, Policy())
    assert verdict.passed
    assert verdict.check("artifacts").status is CheckStatus.NOT_APPLICABLE
    assert verdict.check("drift.baseline").message == "no baseline: nothing to compare the final outputs with"


def _edited_copy(run, tmp_path, edit):
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    data = json.loads((copy / "manifest.json").read_text())
    edit(data)
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


def test_nan_scale_fails_unless_waived(gate_runs, tmp_path):
    def poison(data):
        tensor = next(iter(data["calibration"]["table"]))
        entry = data["calibration"]["table"][tensor]
        entry["scale"] = "nan" if not isinstance(entry["scale"], list) else ["nan"] + entry["scale"][1:]
        data["poisoned"] = tensor

    copy = _edited_copy(gate_runs["same"], tmp_path, poison)
    tensor = json.loads((copy / "manifest.json").read_text())["poisoned"]
    verdict = evaluate_gate(copy, gate_runs["baseline"], Policy())
    params = verdict.check("calibration.params")
    assert params.status is CheckStatus.FAIL and params.message.startswith(f"tensor '{tensor}' has a nan scale")
    waived = evaluate_gate(copy, gate_runs["baseline"], parse_policy(f'[calibration]\nwaive_nonfinite = ["{tensor}"]\n'))
    assert waived.check("calibration.params").status is CheckStatus.PASS
    assert f"waived by the policy: {tensor}" in waived.check("calibration.params").message


def test_disagreeing_calibration_repeat_fails(gate_runs, tmp_path):
    def disagree(data):
        data["sections"]["calib_repeat"]["agree"] = False
        data["sections"]["calib_repeat"]["runs"][1]["md5"] = "0" * 32

    copy = _edited_copy(gate_runs["same"], tmp_path, disagree)
    check = evaluate_gate(copy, gate_runs["baseline"], Policy()).check("calibration.repeat")
    assert check.status is CheckStatus.FAIL
    assert check.message == "2 calibrations disagree (2 distinct md5)"


def test_calibration_repeat_that_agreed_by_chance_fails(gate_runs, tmp_path):
    """Issue 31 item 6: one md5, but the producer of a calibrated tensor varies between runs on the EP."""
    from qconsist.calibration.producers import ProducerCheck, VaryingTensor

    found = ProducerCheck("cuda", 4, 3, 2, [VaryingTensor("upscore", "deconvolution3", "ConvTranspose", ("deconvolution3",), 4)])
    copy = _edited_copy(gate_runs["same"], tmp_path, lambda d: d["sections"]["calib_repeat"].update(producers=found.to_json()))
    check = evaluate_gate(copy, gate_runs["baseline"], Policy()).check("calibration.repeat")
    assert check.status is CheckStatus.FAIL
    assert check.message == (
        "2 calibrations agree, but `upscore`'s range comes from `deconvolution3`, whose output varies between runs on "
        "this EP: the md5 can still change; pin or determinize (2 calibrated tensor(s) compared over 3 runs of 4 "
        "calibration step(s) in one cuda session)")
    assert check.measured["producers_varying"] == ["upscore"] and check.measured["distinct_md5"] == 1


def test_gate_refuses_other_run_kinds(gate_runs, tmp_path):
    copy = _edited_copy(gate_runs["same"], tmp_path, lambda d: d.update(kind="locate"))
    with pytest.raises(RunStoreError, match=r"is of kind 'locate'; the gate judges a pipeline run or a nightly entry"):
        evaluate_gate(copy, gate_runs["baseline"], Policy())


def test_cli_pass_fail_and_files(gate_runs, tmp_path):
    runner = CliRunner()
    policy = tmp_path / "policy.toml"
    policy.write_text('[artifacts]\nhash = "md5"\n')
    ok = runner.invoke(app, ["gate", str(gate_runs["same"]), "--baseline", str(gate_runs["baseline"]), "--policy", str(policy)])
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("PASS open_nsfw: ")
    junit, markdown = tmp_path / "gate.xml", tmp_path / "gate.md"
    bad = runner.invoke(app, ["gate", str(gate_runs["other"]), "--baseline", str(gate_runs["baseline"]), "--policy", str(policy),
                              "--junit", str(junit), "--markdown", str(markdown)])
    assert bad.exit_code == 1, bad.output
    assert "FAIL           artifacts: stage 'quantize' changed" in bad.output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "2" and suite.get("tests") == "10"
    assert markdown.read_text().startswith("## Release gate: ❌ FAIL — open_nsfw")
    as_json = runner.invoke(app, ["gate", str(gate_runs["other"]), "--baseline", str(gate_runs["baseline"]), "--policy", str(policy), "--json"])
    assert as_json.exit_code == 1
    data = json.loads(as_json.stdout)
    assert data["passed"] is False and data["changed_stages"] == ["quantize"]


def test_cli_errors(gate_runs, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["gate", str(tmp_path / "nope"), "--baseline", str(gate_runs["baseline"])])
    assert missing.exit_code == 2
    assert missing.stderr == f"error: run directory {tmp_path / 'nope'} does not exist\n"
    policy = tmp_path / "p.toml"
    policy.write_text("[drift.float]\nmax_abs = 1\n")
    bad = runner.invoke(app, ["gate", str(gate_runs["same"]), "--baseline", str(gate_runs["baseline"]), "--policy", str(policy)])
    assert bad.exit_code == 2
    assert bad.stderr == f"error: {policy}: [drift.float]: unknown key(s) max_abs; known: max_abs_diff, min_sqnr_db, min_top1_agreement\n"


def test_computation_hash_tells_metadata_from_computation(gate_runs, tmp_path):
    """A rebuilt convert artifact whose graph carries another name: md5 gating names the stage and says only
    metadata differs; ``hash = "computation"`` lets it pass, and still catches the recalibrated model."""
    import onnx

    from qconsist.store.hashing import hash_artifact

    copy = tmp_path / "renamed"
    shutil.copytree(gate_runs["same"], copy)
    model = onnx.load(str(copy / "convert/model.onnx"))
    model.graph.name = "/elsewhere/convert/model.onnx"
    onnx.save(model, str(copy / "convert/model.onnx"))
    data = json.loads((copy / "manifest.json").read_text())
    data["stages"][0]["artifact"] = hash_artifact(copy / "convert/model.onnx", copy, model).to_json()
    record = data["stages"][0]["artifact"]
    data["files"]["convert/model.onnx"] = {"sha256": record["sha256"], "md5": record["md5"], "size": record["size"]}
    (copy / "manifest.json").write_text(json.dumps(data))

    strict = evaluate_gate(copy, gate_runs["baseline"], Policy())
    assert strict.changed_stages == ["convert"]
    assert "the computation is the same, only metadata differs: graph.name: " in strict.check("artifacts").message
    assert "'/elsewhere/convert/model.onnx'" in strict.check("artifacts").message
    policy = parse_policy('[artifacts]\nhash = "computation"\n')
    loose = evaluate_gate(copy, gate_runs["baseline"], policy)
    assert loose.check("artifacts").status is CheckStatus.PASS and loose.changed_stages == []
    assert loose.check("artifacts").message == "every stage's computation matches the baseline (md5 differs in metadata only: convert)"
    other = evaluate_gate(gate_runs["other"], gate_runs["baseline"], policy)
    assert other.changed_stages == ["quantize"]
    assert other.check("artifacts").measured["changed"][0]["metadata_only"] is False


def test_baseline_from_another_onnxruntime_fails_the_environment_check(gate_runs, tmp_path):
    """A baseline made with another onnxruntime is not like with like: the gate says so, by name, and a
    policy that accepts the upgrade lets the check pass."""
    def older(data):
        data["environment"]["onnxruntime_module"] = "1.27.0"
        data["environment"]["packages"]["onnxruntime"] = "1.27.0"

    baseline = _edited_copy(gate_runs["baseline"], tmp_path, older)
    installed = json.loads((gate_runs["same"] / "manifest.json").read_text())["environment"]["onnxruntime_module"]
    check = evaluate_gate(gate_runs["same"], baseline, Policy()).check("environment")
    assert check.status is CheckStatus.FAIL
    assert check.message.startswith(f"the baseline ran in another environment (onnxruntime: 1.27.0 (onnxruntime) -> {installed} (onnxruntime))")
    assert check.message.endswith("allow_changed = ['onnxruntime']")
    assert check.measured["changed"] == [{"name": "onnxruntime", "old": "1.27.0 (onnxruntime)", "new": f"{installed} (onnxruntime)"}]
    accepted = evaluate_gate(gate_runs["same"], baseline, parse_policy('[environment]\nallow_changed = ["onnxruntime"]\n'))
    assert accepted.check("environment").status is CheckStatus.PASS
    same = evaluate_gate(gate_runs["same"], gate_runs["baseline"], Policy()).check("environment")
    assert same.status is CheckStatus.PASS and same.measured["changed"] == []


def test_environment_policy_names_unknown_items():
    with pytest.raises(ConfigError, match=r"\[environment\]: allow_changed names unknown item\(s\) onnxruntme; known: onnxruntime, onnx"):
        parse_policy('[environment]\nallow_changed = ["onnxruntme"]\n')
