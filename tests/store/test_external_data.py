"""An artifact is its whole content (issue 29, item 3): a model whose weights lie in an external data file, changed
between two runs, is not "artifacts: identical" in ``diff``; ``run --dump`` of it works. ``run`` records each external
data file (location, size, sha256) with the model's artifact; reading the run verifies them; ``diff`` names a changed
one; a location outside the model's folder is refused."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.diff.artifacts import run_differences
from qconsist.errors import RunStoreError
from qconsist.store.run import Run

runner = CliRunner()


@pytest.fixture()
def external(tmp_path):
    plain = build_classifier_model(tmp_path / "plain.onnx")
    model = tmp_path / "model" / "model.onnx"
    model.parent.mkdir()
    onnx.save(onnx.load(str(plain)), str(model), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.data", size_threshold=0)
    return {"model": model, "data": model.parent / "model.data", "arrays": save_arrays(tmp_path / "arrays.npy", 4, seed=2),
            "runs": tmp_path / "runs"}


def _run(external, run_id, *extra):
    result = runner.invoke(app, ["run", str(external["model"]), "--inputs", str(external["arrays"]), "--runs-dir",
                                 str(external["runs"]), "--run-id", run_id, *extra])
    assert result.exit_code == 0, result.output
    return result


def test_weights_changed_in_external_data_are_not_identical_artifacts(external):
    _run(external, "a")
    blob = bytearray(external["data"].read_bytes())
    blob[10] ^= 0x40  # one weight of conv_w, the .onnx file untouched
    external["data"].write_bytes(bytes(blob))
    _run(external, "b")
    result = runner.invoke(app, ["diff", str(external["runs"] / "a"), str(external["runs"] / "b")])
    assert result.exit_code in (0, 1), result.output
    lines = result.stdout.splitlines()
    assert "artifacts: identical" not in lines
    assert lines[3:5] == ["artifacts: first differing stage: model",
                          "  model: the same .onnx bytes with another recorded content hash: the weights in its external data "
                          "model.data changed between the runs"]


def test_run_dump_of_a_model_with_external_data(external):
    result = _run(external, "dumped", "--dump")
    assert "dump faithful: final outputs bit-identical to production in 4 samples" in result.stdout + result.stderr
    assert (external["runs"] / "dumped" / "dump" / "optimized.onnx").is_file()
    assert not (external["runs"] / "dumped" / "dump" / "model.data").exists()


# --- the record of the external data files, verified on every read (issue 29 item 3, "an artifact is its whole
# content") -------------------------------------------------------------------------------------------------------


@pytest.fixture()
def weights(tmp_path):
    """A model saved as the issue's case: every tensor in one file ``weights.bin`` beside the ``.onnx``."""
    plain = build_classifier_model(tmp_path / "plain.onnx")
    model = tmp_path / "model" / "model.onnx"
    model.parent.mkdir()
    onnx.save_model(onnx.load(str(plain)), str(model), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return {"model": model, "data": model.parent / "weights.bin", "arrays": save_arrays(tmp_path / "arrays.npy", 4, seed=2),
            "runs": tmp_path / "runs"}


def _flip(path, at=10):
    blob = bytearray(path.read_bytes())
    blob[at] ^= 0x40
    path.write_bytes(bytes(blob))


def test_run_records_each_external_data_file_with_the_model(weights):
    _run(weights, "a")
    data = weights["data"].read_bytes()
    manifest = json.loads((weights["runs"] / "a" / "manifest.json").read_text())
    expected = [{"location": "weights.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    assert manifest["model"]["artifact"]["external_data"] == expected
    assert manifest["stages"][0]["artifact"]["external_data"] == expected
    assert Run.open(weights["runs"] / "a").ran_model() == weights["model"].resolve()
    plain = {**weights, "model": weights["model"].parent.parent / "plain.onnx"}  # self-contained: nothing more recorded
    _run(plain, "plain")
    assert "external_data" not in json.loads((weights["runs"] / "plain" / "manifest.json").read_text())["model"]["artifact"]


def test_a_changed_weights_file_is_an_error_naming_it(weights):
    _run(weights, "a")
    before = hashlib.sha256(weights["data"].read_bytes()).hexdigest()
    _flip(weights["data"])
    after = hashlib.sha256(weights["data"].read_bytes()).hexdigest()
    run_dir = weights["runs"] / "a"
    expected = (f"run {run_dir}: external data weights.bin of the model it ran, {weights['model'].resolve()}, changed "
                f"since the run (sha256 {before[:12]}… recorded, {after[:12]}… found)")
    for read in (lambda run: run.ran_model(), lambda run: run.model("model")):
        with pytest.raises(RunStoreError) as caught:
            read(Run.open(run_dir))
        assert str(caught.value) == expected
    weights["data"].write_bytes(weights["data"].read_bytes() + b"\0")
    with pytest.raises(RunStoreError) as caught:
        Run.open(run_dir).ran_model()
    assert str(caught.value) == (f"run {run_dir}: external data weights.bin of the model it ran, "
                                 f"{weights['model'].resolve()}, changed since the run (size 1076 recorded, 1077 found)")


def test_diff_names_the_changed_external_data_file(weights):
    _run(weights, "a")
    before = hashlib.sha256(weights["data"].read_bytes()).hexdigest()
    _flip(weights["data"])
    after = hashlib.sha256(weights["data"].read_bytes()).hexdigest()
    _run(weights, "b")
    result = runner.invoke(app, ["diff", str(weights["runs"] / "a"), str(weights["runs"] / "b")])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[2:5] == [
        f"runs differ: external data: weights.bin changed (sha256 {before[:12]}… in A, {after[:12]}… in B)",
        "artifacts: first differing stage: model",
        "  model: the same .onnx bytes with another recorded content hash: the weights in its external data weights.bin "
        "changed between the runs"]
    differences, same = run_differences(Run.open(weights["runs"] / "a"), Run.open(weights["runs"] / "b"))
    assert (differences, same) == ([f"external data: weights.bin changed (sha256 {before[:12]}… in A, {after[:12]}… in B)"],
                                   False)


@pytest.mark.parametrize("location", ["../weights.bin", "/abs"])
def test_a_location_outside_the_models_folder_is_refused(weights, location):
    model = onnx.load(str(weights["model"]), load_external_data=False)
    if location == "/abs":
        location = str(weights["data"])  # the real file, named by absolute path
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    escaping = weights["model"].parent / "escaping.onnx"
    onnx.save_model(model, str(escaping))
    (weights["model"].parent.parent / "weights.bin").write_bytes(weights["data"].read_bytes())
    result = runner.invoke(app, ["run", str(escaping), "--inputs", str(weights["arrays"]), "--runs-dir",
                                 str(weights["runs"]), "--run-id", "escaping"])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {escaping}: tensor conv_w keeps its data in {location!r}, outside the model's folder "
        f"{escaping.parent}; refused (external data must lie beside the model or below its folder)"]


def test_a_manifest_naming_external_data_outside_the_folder_is_refused(weights):
    _run(weights, "a")
    path = weights["runs"] / "a" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["model"]["artifact"]["external_data"][0]["location"] = "../weights.bin"
    path.write_text(json.dumps(manifest))
    with pytest.raises(RunStoreError) as caught:
        Run.open(weights["runs"] / "a").ran_model()
    assert str(caught.value) == (f"run {weights['runs'] / 'a'}: the manifest names external data '../weights.bin' of "
                                 f"{weights['model'].resolve()} outside the model's folder; refused")


def _forget_external_data(run_dir):
    """The run as qconsist wrote it before it recorded a model's external data."""
    path = run_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["model"]["artifact"]["external_data"]
    del manifest["stages"][0]["artifact"]["external_data"]
    path.write_text(json.dumps(manifest))


def test_a_run_recorded_before_external_data_reads_as_before(weights):
    _run(weights, "a")
    _forget_external_data(weights["runs"] / "a")
    _flip(weights["data"])
    assert Run.open(weights["runs"] / "a").ran_model() == weights["model"].resolve()
    _run(weights, "b")
    _forget_external_data(weights["runs"] / "b")
    result = runner.invoke(app, ["diff", str(weights["runs"] / "a"), str(weights["runs"] / "b")])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[2:4] == [
        "artifacts: first differing stage: model",
        "  model: the same .onnx bytes with another recorded content hash: the weights in its external data files "
        "changed between the runs (the files as they are now cannot show which)"]
