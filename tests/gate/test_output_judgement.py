"""Each output judged for what it is, through the pipeline's quantize check and the gate: a quantization that
destroys a map fails both (it printed "top-1 agreement 0%" and exited 0), naming the output and the nodes
that lose most; a detector is judged part by part (NudeNet 320n: its int8 quantization rounds every class score
to zero, which the whole output's figures hide; with int16 activations it passes the default policy)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from output_models import build_outlier_map_model, save_map_inputs
from qconsist.cli import app
from qconsist.gate import Policy, evaluate_gate
from qconsist.gate.verdict import CheckStatus
from qconsist.store.rundir import run_state


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def map_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("map")
    return {"model": build_outlier_map_model(folder / "map.onnx"), "data": save_map_inputs(folder / "x.npy"), "folder": folder}


def _pipeline(folder: Path, made: dict, extra: str = "", evaluation: str = '[evaluation]\noutputs = {map = "map"}\n') -> Path:
    path = folder / "map.toml"
    path.write_text(f'name = "map"\n[model]\nonnx = "{made["model"]}"\n[calibration]\ndata = "{made["data"]}"\nrepeat = 2\n'
                    f'{evaluation}{extra}')
    return path


def test_destroyed_map_fails_the_quantize_check_and_keeps_the_run(map_model, tmp_path):
    result = _invoke("pipeline", "run", _pipeline(tmp_path, map_model), "--run-id", "destroyed")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[5].startswith("  check quantize: max abs diff ")
    assert re.search(r"vs optimize; map \(map\): SQNR 0\.0 dB, cosine 0\.00000, greatest difference \d+\.\d+ on 6 evaluation "
                     r"inputs: FAILED \(floor 15 dB\)$", lines[5]), lines[5]  # the one wording of a judgement (compare/output.describe_judgement)
    assert lines[7] == ("FAILED check quantize: output map (map): SQNR 0.0 dB against the float model (optimize stage), "
                        "below the floor of 15 dB ([quantize] min_sqnr_db)")
    assert re.fullmatch(r"  map: nodes losing most on the way \(quant-error, SQNR in -> out\): conv3 \(Conv, \d+\.\d -> 0\.0 dB\)",
                        lines[8]), lines[8]
    assert run_state(Path("runs/destroyed")) == "complete"  # kept: quant-error and the gate read it
    check = json.loads(Path("runs/destroyed/manifest.json").read_text())["stages"][2]["checks"]["outputs_vs_optimize"]
    assert check["passed"] is False and check["below_floor"] == ["map"] and check["min_sqnr_db"] == 15.0
    assert check["top1_agreement"] is None  # a map has no top-1
    assert check["judged"][0]["kind"] == "map" and check["judged"][0]["why"] == "declared in [evaluation] outputs"


def test_floor_off_records_only(map_model, tmp_path):
    result = _invoke("pipeline", "run", _pipeline(tmp_path, map_model, '[quantize]\nmin_sqnr_db = "off"\n'), "--run-id", "off")
    assert result.exit_code == 0, result.output
    assert "FAILED" not in result.stdout and "map (map): SQNR 0.0 dB" in result.stdout


def test_default_gate_fails_the_destroyed_map_naming_output_and_nodes(map_model, tmp_path):
    assert _invoke("pipeline", "run", _pipeline(tmp_path, map_model), "--run-id", "gated").exit_code == 1
    verdict = evaluate_gate(Path("runs/gated"), None, Policy())
    drift = verdict.check("drift.float")
    assert drift.status is CheckStatus.FAIL
    assert re.match(r"against the float model \(optimize stage\): output map \(map\) SQNR 0\.0 dB < 15 dB \(nodes losing "
                    r"most on the way \(quant-error, SQNR in -> out\): conv3 \(Conv, \d+\.\d -> 0\.0 dB\)\); greatest "
                    r"absolute difference [\d.]+ at map\[", drift.message), drift.message
    assert drift.measured["below_floor"] == ["map"] and drift.tolerance["min_sqnr_db"] == 15.0
    assert [reason.split(":")[0] for reason in verdict.reasons] == ["drift.float"]


def test_undeclared_map_is_judged_by_sqnr_not_top1(map_model, tmp_path):
    """Without the declaration the map's kind is not inferred (a Conv makes it): no top-1, SQNR judges it."""
    result = _invoke("pipeline", "run", _pipeline(tmp_path, map_model, evaluation=""), "--run-id", "undeclared", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["failures"] == ["check quantize: output map (undeclared): SQNR 0.0 dB against the float model (optimize "
                                "stage), below the floor of 15 dB"]
    assert list(data["losing_nodes"]) == ["map"]
    check = data["checks"]["quantize"]["outputs_vs_optimize"]
    assert check["judged"][0]["why"] == "not inferred: produced by Conv 'conv3'" and check["top1_agreement"] is None


@pytest.mark.parametrize("evaluation, message", [
    ('[evaluation]\noutputs = {prob = "class-scores"}\n',
     "[evaluation] outputs names 'prob', which the model does not output (its outputs: map)"),
    ('[evaluation]\noutputs = {map = "segmentation"}\n',
     "{path}: [evaluation] outputs: output 'map' has kind 'segmentation'; kinds: class-scores, map, regression"),
    ('[evaluation]\noutputs = ["map"]\n', "{path}: evaluation.outputs must be a table, got ['map']"),
])
def test_bad_declarations_are_one_line(map_model, tmp_path, evaluation, message):
    path = _pipeline(tmp_path, map_model, evaluation=evaluation)
    result = _invoke("pipeline", "run", path)
    assert result.exit_code == 2 and result.stderr == f"error: {message.format(path=path.resolve())}\n"
    assert not Path("runs").exists() or list(Path("runs").iterdir()) == []


# --- a real detector ------------------------------------------------------------------------------------------

NUDENET = (
    'name = "nudenet"\n[model]\nsource = "nudenet_320n"\n'
    '[preprocess]\nresize = [320, 320]\nchannel_order = "RGB"\npixel_range = 1.0\n'
    '[calibration]\ndata = "package:photos"\ncount = 12\nrepeat = 2\n'
    '[quantize]\nper_channel = true\n{quantize}'
    '[evaluation]\ndata = "package:photos"\noffset = 12\ncount = 9\n'
)


@pytest.mark.slow
def test_nudenet_int8_fails_the_default_policy_on_its_class_scores(tmp_path):
    (tmp_path / "n.toml").write_text(NUDENET.format(quantize=""))
    result = _invoke("pipeline", "run", tmp_path / "n.toml", "--run-id", "int8")
    assert result.exit_code == 1, result.output
    # measured here: whole output and boxes 27.9 dB, the scores' Sigmoid 25.7 -> 5.1 dB, the scores part 0.0 dB
    number = r"\d+\.\d"
    assert re.search(r"output0 \(undeclared\): SQNR 2\d\.\d dB, cosine 0\.99\d+, greatest difference [\d.]+; output0\[:, 0:4\] "
                     r"\(undeclared\): SQNR 2\d\.\d dB, cosine 0\.99\d+, greatest difference [\d.]+; output0\[:, 4:22\] "
                     r"\(undeclared\): SQNR 0\.0 dB, cosine 0\.00000, greatest difference [\d.]+ on 9 evaluation inputs",
                     result.stdout), result.stdout
    assert re.search(rf"  output0\[:, 4:22\]: Concat '/model.22/Concat_25' takes /model.22/Sigmoid_output_0 at {number} dB and "
                     rf"gives it out at 0\.0 dB \(loses {number} dB there\); nodes losing most on the way \(quant-error, SQNR "
                     rf"in -> out\): /model.22/Sigmoid \(Sigmoid, {number} -> {number} dB\)", result.stdout), result.stdout
    verdict = evaluate_gate(Path("runs/int8"), None, Policy())
    assert [r.split(":")[0] for r in verdict.reasons] == ["drift.float"]
    assert verdict.check("drift.float").measured["below_floor"] == ["output0[:, 4:22]"]


@pytest.mark.slow
def test_nudenet_with_int16_activations_passes_the_default_policy(tmp_path):
    """Its first output is box regression (no top-1 judged: the 88.9% "top-1" of box coordinates failed it)."""
    (tmp_path / "n.toml").write_text(NUDENET.format(quantize='activation_type = "int16"\nnodes_to_exclude = ["/model.22/Concat_25"]\n'))
    result = _invoke("pipeline", "run", tmp_path / "n.toml", "--run-id", "int16")
    assert result.exit_code == 0, result.output
    verdict = evaluate_gate(Path("runs/int16"), None, Policy())
    assert verdict.passed, verdict.reasons
    judged = {o["label"]: o for o in verdict.check("drift.float").measured["outputs"]}
    assert sorted(judged) == ["output0", "output0[:, 0:4]", "output0[:, 4:22]"]
    assert all(o["top1_agreement"] is None for o in judged.values())
    assert judged["output0[:, 4:22]"]["sqnr_db"] > 15 and judged["output0[:, 0:4]"]["sqnr_db"] > 35


def test_runs_and_policies_from_before_kinds_still_read(tmp_path, small_models):
    """A run recorded before outputs had kinds (no [evaluation] outputs in its pipeline record, a quantize check
    with only the first output's top-1) and a policy without min_sqnr_db: the gate reads both, reads the kinds from
    the run's float model and applies the default floor."""
    from qconsist.gate import parse_policy

    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{small_models["classifier"]}"\n[calibration]\ndata = "{small_models["arrays"]}"\nrepeat = 2\n')
    assert _invoke("pipeline", "run", pipeline, "--run-id", "old").exit_code == 0
    manifest_path = Path("runs/old/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    del manifest["sections"]["pipeline"]["outputs"]
    check = manifest["stages"][2]["checks"]["outputs_vs_optimize"]
    for key in ("judged", "below_floor", "min_sqnr_db"):
        del check[key]
    manifest_path.write_text(json.dumps(manifest))
    old_policy = parse_policy('[drift.float]\nmax_abs_diff = 0.05\nmin_top1_agreement = 0.9\n')
    assert old_policy.drift.float.min_sqnr_db == 15.0
    verdict = evaluate_gate(Path("runs/old"), None, old_policy)
    assert verdict.passed, verdict.reasons
    (prob,) = verdict.check("drift.float").measured["outputs"]
    assert prob["kind"] == "class-scores" and prob["why"].startswith("inferred: Softmax 'softmax' over axis 1")
    assert verdict.to_json()["same_run"] is False
