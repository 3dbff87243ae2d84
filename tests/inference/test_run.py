"""qconsist run: execution options, the run directory, and the faithful dump."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mix64_reference import reference_mix64
from onnx import TensorProto, helper
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import ConfigError, UnavailableError
from qconsist.inference import ExecutionOptions, create_session
from qconsist.inference.fingerprint import RECORD
from qconsist.inference.reader import load_dump
from qconsist.store.run import Run


def _gelu_model(path: Path) -> Path:
    """x → com.microsoft:Gelu → Relu → y: onnx shape inference cannot type the Gelu output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3])
    nodes = [
        helper.make_node("Gelu", ["x"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node("Relu", ["g"], ["y"], name="relu"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "gelu", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _arrays(path: Path, count: int = 3) -> Path:
    np.save(path, np.random.default_rng(7).standard_normal((count, 4, 3)).astype(np.float32))
    return path


def test_options_are_validated():
    with pytest.raises(ConfigError, match=r"execution provider cpu takes no option use_tf32 \(its options: none\)"):
        ExecutionOptions(provider_options={"use_tf32": True})
    with pytest.raises(ConfigError, match=r"unknown execution provider 'tpu'; known: cpu, cuda"):
        ExecutionOptions("tpu")
    with pytest.raises(ConfigError, match=r"cuda option use_tf32 must be true or false, got 'maybe'"):
        ExecutionOptions("cuda", {"use_tf32": "maybe"})
    with pytest.raises(ConfigError, match=r"cuda option cudnn_conv_algo_search must be one of EXHAUSTIVE, HEURISTIC, DEFAULT, got 'FAST'"):
        ExecutionOptions("cuda", {"cudnn_conv_algo_search": "FAST"})
    with pytest.raises(ConfigError, match=r"graph_optimization_level 'max' is not one of disable, basic, extended, all"):
        ExecutionOptions(graph_optimization_level="max")
    with pytest.raises(ConfigError, match=r"intra_op_threads must be a non-negative integer, got -1"):
        ExecutionOptions(intra_op_threads=-1)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) tf32"):
        ExecutionOptions.from_json({"tf32": True})
    opts = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "heuristic", "use_tf32": False, "device_id": 0})
    assert opts.ort_providers() == [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC", "device_id": "0",
                                                               "use_tf32": "0"}), "CPUExecutionProvider"]
    assert ExecutionOptions.from_json(opts.to_json()) == opts
    assert ExecutionOptions().ort_providers() == ["CPUExecutionProvider"]
    # runs recorded before the provider registry wrote the CUDA options flat
    old = {"ep": "cuda", "graph_optimization_level": "all", "intra_op_threads": None, "deterministic_compute": None,
           "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False, "cudnn_conv_use_max_workspace": None, "device_id": 0}
    assert ExecutionOptions.from_json(old) == opts


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this machine has CUDA")
def test_cuda_unavailable_is_exit_3(tmp_path):
    model = _gelu_model(tmp_path / "m.onnx")
    message = ("execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime (available: "
               f"{', '.join(ort.get_available_providers())}); for cuda install onnxruntime-gpu (qconsist[gpu]) on a machine "
               "with an NVIDIA GPU")
    with pytest.raises(UnavailableError, match=re.escape(message)):
        create_session(model, ExecutionOptions("cuda"))
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(_arrays(tmp_path / "x.npy")), "--ep", "cuda"])
    assert out.exit_code == 3, out.output
    assert out.stderr == f"error: {message}\n"


def test_run_writes_an_inference_run_directory(tmp_path):
    model = _gelu_model(tmp_path / "m.onnx")
    x = np.load(_arrays(tmp_path / "x.npy"))
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(tmp_path / "x.npy"), "--runs-dir", "runs", "--run-id", "r1", "--json"])
    assert out.exit_code == 0, out.output
    run = Path("runs/r1")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["kind"] == "inference" and manifest["status"] == "complete"
    assert manifest["sections"]["inference"]["options"]["graph_optimization_level"] == "all"
    assert manifest["stages"][0]["artifact"]["md5"] == manifest["model"]["artifact"]["md5"]
    assert manifest["sections"]["inference"]["output_files"] == ["outputs/o0.npy"]
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()) == [
        "inputs/samples.jsonl", "manifest.json", "outputs/o0.npy"]  # one file per output, not per sample
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    saved = np.load(run / "outputs" / "o0.npy", allow_pickle=False)
    assert saved.shape[0] == 3
    for i in range(3):
        expected = sess.run(None, {"x": x[i : i + 1]})[0]
        assert saved[i].shape == expected.shape and saved[i].tobytes() == expected.tobytes()
    assert [a[0].tobytes() for a in map(Run.open(run).outputs().sample, range(3))] == [saved[i].tobytes() for i in range(3)]


def test_dump_keeps_a_tensor_shape_inference_cannot_type(tmp_path):
    model = _gelu_model(tmp_path / "m.onnx")
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(model)))
    assert "g" not in {v.name for v in inferred.graph.value_info}  # onnx cannot type the Gelu output
    x = np.load(_arrays(tmp_path / "x.npy"))
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(tmp_path / "x.npy"), "--runs-dir", "runs", "--run-id", "d", "--dump", "--raw", "gelu"])
    assert out.exit_code == 0, out.output
    assert "dump faithful: final outputs bit-identical to production in 3 samples" in out.output
    index = json.loads(Path("runs/d/dump/index.json").read_text())
    column = [t["name"] for t in index["tensors"]].index("g")
    assert index["tensors"][column]["dtype"] == "float32" and index["tensors"][column]["label"] == "gelu"
    table = load_dump(Run.open("runs/d")).table
    expose = onnx.load(str(model))
    expose.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 4, 3]))
    sess = ort.InferenceSession(expose.SerializeToString(), providers=["CPUExecutionProvider"])
    for i in range(3):
        g = sess.run(["g"], {"x": x[i : i + 1]})[0]
        assert table.record(i, column)["hash"] == reference_mix64(g.tobytes())
        with np.load(f"runs/d/dump/raw/{i:06d}.npz", allow_pickle=False) as raw:
            assert np.array_equal(raw[f"t{column}"], g)


def test_raw_of_unknown_node_is_refused(tmp_path):
    model = _gelu_model(tmp_path / "m.onnx")
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(_arrays(tmp_path / "x.npy")), "--dump", "--raw", "nope"])
    assert out.exit_code == 2
    assert out.output.startswith("error: --raw: no dumped tensor belongs to a node named 'nope'")
    assert not Path("runs").exists() or not any(Path("runs").iterdir())
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(tmp_path / "x.npy"), "--raw", "all"])
    assert out.exit_code == 2 and out.output == "error: --raw needs --dump\n"


def test_open_nsfw_dump_at_level_all_is_faithful(nsfw_run, tmp_path):
    from qconsist.inference.model import resolve_model
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline

    pipeline = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml"
    out = CliRunner().invoke(app, [
        "run", str(nsfw_run.path), "--inputs", "package:photos", "--pipeline", str(pipeline), "--count", "2",
        "--dump", "--runs-dir", "runs", "--run-id", "n", "--json",
    ])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["dump"]["faithful"] is True and data["dump"]["samples_checked"] == 2
    assert data["dump"]["bytes_per_tensor_per_sample"] < RECORD.itemsize  # the compact table, its headers included
    manifest = json.loads(Path("runs/n/manifest.json").read_text())
    assert manifest["model"]["stage"] == "quantize" and manifest["sections"]["dump"]["faithful"] is True
    optimized = onnx.load("runs/n/dump/optimized.onnx")
    assert any(n.op_type == "QLinearConv" for n in optimized.graph.node)  # what ORT runs, fused
    # final output fingerprints equal an independent production session's outputs
    source = resolve_model(nsfw_run.path)
    name = input_specs(source.path)[0].name
    photos = open_input_set("package:photos", load_pipeline(pipeline).preprocess, name)
    sess = ort.InferenceSession(str(source.path), providers=["CPUExecutionProvider"])
    dump = load_dump(Run.open("runs/n"))
    column = [t.name for t in dump.tensors].index("prob")
    stored = np.load("runs/n/outputs/o0.npy")
    for i in range(2):
        prob = sess.run(None, photos.sample(i))[0]
        assert dump.table.record(i, column)["hash"] == reference_mix64(prob.tobytes()) == reference_mix64(stored[i].tobytes())
