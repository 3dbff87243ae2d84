"""qconsist diff refuses incomplete runs, runs on different input sets and runs of different models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.errors import RunStoreError
from qconsist.store.rundir import RunDirectory


def _model(path: Path, ops: list[str]) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    names = ["x"] + [f"t{i}" for i in range(len(ops) - 1)] + ["y"]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]], name=f"{op.lower()}{i}") for i, op in enumerate(ops)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _run(model: Path, inputs: Path, run_id: str) -> Path:
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(inputs), "--dump", "--runs-dir", "runs", "--run-id", run_id])
    assert out.exit_code == 0, out.output
    return Path("runs") / run_id


@pytest.fixture
def setup(tmp_path):
    rng = np.random.default_rng(3)
    np.save(tmp_path / "a.npy", rng.standard_normal((2, 4)).astype(np.float32))
    np.save(tmp_path / "b.npy", rng.standard_normal((2, 4)).astype(np.float32))
    return {
        "relu": _model(tmp_path / "relu.onnx", ["Relu", "Neg"]),
        "abs": _model(tmp_path / "abs.onnx", ["Abs", "Neg", "Neg"]),
        "a": tmp_path / "a.npy", "b": tmp_path / "b.npy",
    }


def test_incomplete_run_is_refused(setup):
    good = _run(setup["relu"], setup["a"], "good")
    RunDirectory.create(Path("runs"), "x", "inference", run_id="broken")  # never finished
    out = CliRunner().invoke(app, ["diff", str(good), "runs/broken"])
    assert out.exit_code == 2
    assert out.output.startswith("error: run runs/broken is incomplete (started ")
    assert out.output.rstrip().endswith("it was interrupted or is still running; rerun it")


def test_different_input_sets_are_refused(setup):
    a = _run(setup["relu"], setup["a"], "a")
    b = _run(setup["relu"], setup["b"], "b")
    with pytest.raises(RunStoreError, match=r"runs on different input sets .* input digests differ"):
        diff_runs(a, b)
    out = CliRunner().invoke(app, ["diff", str(a), str(b)])
    assert out.exit_code == 2 and out.output.startswith("error: runs on different input sets")


def test_different_models_are_refused_for_tensor_comparison(setup):
    a = _run(setup["relu"], setup["a"], "a")
    b = _run(setup["abs"], setup["a"], "b")
    out = CliRunner().invoke(app, ["diff", str(a), str(b)])
    assert out.exit_code == 2
    assert out.output == (
        "error: runs of different models: their graphs differ structurally (nodes or tensors), so tensors "
        "cannot be compared node by node; compare runs of the same model (a float model against its "
        "quantization: `qconsist quant-error RUN` ranks the nodes by quantization error)\n"
    )


def test_identical_small_runs_exit_0(setup):
    a = _run(setup["relu"], setup["a"], "a")
    b = _run(setup["relu"], setup["a"], "b")
    result = diff_runs(a, b)
    assert result.passed and result.tensors.compared == 2 and result.tensors.origins == []
    assert CliRunner().invoke(app, ["diff", str(a), str(b)]).exit_code == 0


def _renamed_copy(source: Path, target: Path, name: str, caffemodel_sha256: str | None = None) -> Path:
    import json
    import shutil

    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["model"]["name"] = name
    if caffemodel_sha256:
        manifest["model"]["files"]["caffemodel"]["sha256"] = caffemodel_sha256
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_pipelines_of_one_model_under_two_names_are_compared(nsfw_run, tmp_path):
    """E.g. open_nsfw.toml and open_nsfw_cuda.toml: different pipeline names, byte-identical model files."""
    twin = _renamed_copy(nsfw_run.path, tmp_path / "twin", "open_nsfw-cuda")
    result = diff_runs(nsfw_run.path, twin)
    assert result.passed
    other = _renamed_copy(nsfw_run.path, tmp_path / "other", "another-net", caffemodel_sha256="0" * 64)
    with pytest.raises(RunStoreError, match=r"runs of different models: .* is 'open_nsfw', .*other is 'another-net'"):
        diff_runs(nsfw_run.path, other)


def _make_legacy(run: Path) -> None:
    """Rewrite a run's fingerprint table as qconsist wrote it before hash functions were recorded (one .npy of
    records, ``dump/fingerprints.npy``)."""
    from qconsist.inference.reader import load_dump
    from qconsist.store.run import Run

    compact = load_dump(Run.open(run)).table
    table = np.stack([compact.row(s) for s in range(compact.samples)])
    table_path = run / "dump" / "fingerprints.npy"
    legacy = np.dtype([(n, "<u2" if n == "present" else table.dtype[n]) for n in table.dtype.names if n != "function"])
    old = np.zeros(table.shape, dtype=legacy)
    for name in legacy.names:
        old[name] = table[name]
    np.save(table_path, old)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.pop("files")  # nor did it record the sha256 of every file: its table is not verified
    manifest["sections"]["dump"].update(fingerprints="dump/fingerprints.npy", table_format="")
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_hashes_of_different_functions_are_refused_in_one_line(setup):
    """A dump written before qc-mix64/1 (xxh3-64 hashes, 2-byte `present`) is not compared with a new one."""
    a = _run(setup["relu"], setup["a"], "a")
    b = _run(setup["relu"], setup["a"], "b")
    _make_legacy(b)
    with pytest.raises(RunStoreError, match=r"fingerprinted with qc-mix64/1 and run runs/b with xxh3-64"):
        diff_runs(a, b)
    out = CliRunner().invoke(app, ["diff", str(a), str(b)])
    assert out.exit_code == 2
    assert out.output == (
        "error: run runs/a was fingerprinted with qc-mix64/1 and run runs/b with xxh3-64: hashes of different "
        "functions cannot be compared; dump both runs with this qconsist version\n"
    )


def test_raw_auto_keeps_what_differs_from_a_reference_of_the_same_hash_function(setup):
    a = _run(setup["relu"], setup["a"], "a")
    out = CliRunner().invoke(app, ["run", str(setup["relu"]), "--inputs", str(setup["a"]), "--dump", "--raw", "auto",
                                   "--reference", str(a), "--runs-dir", "runs", "--run-id", "b", "--json"])
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in (Path("runs/b/dump/raw")).iterdir()) == ["000000.npz", "000001.npz"]
    with np.load("runs/b/dump/raw/000000.npz") as saved:
        assert saved.files == ["t1"]  # identical runs: only the final output (column 1) is kept
    _make_legacy(a)
    out = CliRunner().invoke(app, ["run", str(setup["relu"]), "--inputs", str(setup["a"]), "--dump", "--raw", "auto",
                                   "--reference", str(a), "--runs-dir", "runs", "--run-id", "c"])
    assert out.exit_code == 2
    assert out.output == (
        "error: --reference runs/a was fingerprinted with xxh3-64 and this run with qc-mix64/1: hashes of different "
        "functions cannot be compared; dump both runs with this qconsist version\n"
    )
