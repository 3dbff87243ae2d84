"""Layouts from the graph, never from shapes (issue 19, item 1).

ORT's NHWC transformer runs a quantized conv channels last and moves its Transposes through the
DequantizeLinear and PRelu after it, which keep their names. When C == H == W the NHWC tensor has the NCHW
tensor's shape; compared element by element with it, a healthy conv was named as an origin and ranked worst by
quant-error. Models built in code put the coincidences on purpose (C == H == W, C == W != H, 1x1 spatial) and
a property test sweeps conv geometries: `diff` of level all against disable names no origin whose raw tensors
agree (in the original's axis order), and quant-error's per-node SQNR at level all agrees with level disable
within quantization noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_builders import prelu_conv_model
from qconsist.diff import diff_runs
from qconsist.diff.quantization import quantization_error
from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set
from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline

SAMPLES = 6
# quantization noise between the two levels, for a node observed the same way at both (both DequantizeLinear
# outputs): the fused QLinearConv path and the unfused one round a few values one step apart. (A PRelu that ORT
# computes before its QuantizeLinear at level all is observed after the Q/DQ pair at level disable: one 8-bit
# rounding more, up to 7 dB on a 1x1x1 tensor; those are not compared.)
SAME_WAY_DB = 0.5


def _agree(result_all, result_disable) -> int:
    """Every node observed the same way at both levels has the same SQNR within noise; how many there were."""
    at_all = {e.node: e for e in [*result_all.tensors, *result_all.outputs]}
    at_disable = {e.node: e for e in [*result_disable.tensors, *result_disable.outputs]}
    compared = 0
    for node in set(at_all) & set(at_disable):
        a, b = at_all[node], at_disable[node]
        if a.how.split(",")[0] == b.how.split(",")[0]:
            compared += 1
            assert abs(a.sqnr_db - b.sqnr_db) <= SAME_WAY_DB, (node, a.how, a.sqnr_db, b.how, b.sqnr_db)
    return compared
RELAID = {"conv1_out_DequantizeLinear", "prelu1", "conv2_out_DequantizeLinear", "prelu2"}


def _levels(folder: Path, model: onnx.ModelProto, seed: int = 0) -> dict:
    """The model quantized (QDQ) by a pipeline, dumped at levels all and disable with every raw tensor, their
    diff, and quant-error at both levels."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:]
    np.save(folder / "samples.npy", np.random.default_rng(seed).normal(0, 1, (SAMPLES, *shape)).astype(np.float32))
    config = parse_pipeline({"name": "stage", "model": {"onnx": str(folder / "model.onnx")},
                             "calibration": {"data": str(folder / "samples.npy")}, "quantize": {"format": "QDQ"}},
                            folder / "pipeline.toml")
    run = run_pipeline(config, runs_dir=folder / "runs", run_id="pipeline").path
    inputs = open_input_set(str(folder / "samples.npy"), None, "x")
    dumps = {}
    for level in ("all", "disable"):
        request = RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True, raw=RawSelection.parse("all"))
        dumps[level] = run_inference(resolve_model(run), inputs, request, folder / "runs", run_id=level).run_dir
    errors = {level: quantization_error(run, inputs, ExecutionOptions(graph_optimization_level=level))
              for level in ("all", "disable")}
    return {"run": run, "dumps": dumps, "diff": diff_runs(dumps["all"], dumps["disable"]), "errors": errors}


def _raw(run_dir: Path) -> tuple[dict, list[dict]]:
    """Per original tensor: its raw arrays in every sample (as the dump recorded them); the index's tensors."""
    tensors = json.loads((run_dir / "dump" / "index.json").read_text())["tensors"]
    arrays: dict[str, list[np.ndarray]] = {}
    for sample in range(SAMPLES):
        with np.load(run_dir / "dump" / "raw" / f"{sample:06d}.npz") as npz:
            for column, tensor in enumerate(tensors):
                if tensor["original"] and tensor["original"] not in arrays or (tensor["original"] and len(arrays[tensor["original"]]) == sample):
                    arrays.setdefault(tensor["original"], []).append(npz[f"t{column}"])
    return arrays, tensors


def _sqnr(result) -> dict[str, float]:
    return {e.node: e.sqnr_db for e in [*result.tensors, *result.outputs]}


@pytest.mark.parametrize("geometry", [(10, 10, 10), (10, 6, 10), (8, 1, 1)], ids=["C==H==W", "C==W!=H", "1x1 spatial"])
def test_coinciding_shapes_are_laid_out_from_the_graph(tmp_path, geometry):
    channels, height, width = geometry
    found = _levels(tmp_path, prelu_conv_model(channels, height, width))
    arrays_all, tensors_all = _raw(found["dumps"]["all"])
    arrays_disable, _ = _raw(found["dumps"]["disable"])
    # diff names no healthy node: nothing diverges at all in these models
    assert [n.label for n in found["diff"].tensors.origins] == []
    assert [n.label for n in found["diff"].tensors.nodes] == []
    # quant-error reads the NHWC tensors back: every conv at level all, with level disable's SQNR
    at_all, at_disable = _sqnr(found["errors"]["all"]), _sqnr(found["errors"]["disable"])
    assert {"conv1", "prelu1", "conv2", "prelu2", "conv3"} <= set(at_all)
    assert at_all["conv1"] == pytest.approx(at_disable["conv1"], abs=1e-9)  # the same values
    assert {e.how for e in found["errors"]["all"].tensors if e.node == "conv1"} == {"DequantizeLinear output, NHWC"}
    assert _agree(found["errors"]["all"], found["errors"]["disable"]) >= 3  # conv1, conv2, conv3 at least
    # the map records the NHWC transformer's permutation, read from the graph
    relaid = {t["name"]: t for t in tensors_all if t["how"] == "relayout"}
    assert set(relaid) == RELAID
    assert {tuple(t["layout"]) for t in relaid.values()} == {(0, 2, 3, 1)}
    # recorded in the original's axis order: bit-identical to level disable's
    for name in ("conv1_out_DequantizeLinear_Output", "prelu1_out"):
        assert arrays_all[name][0].shape == (1, channels, height, width)
        assert all(np.array_equal(a, b) for a, b in zip(arrays_all[name], arrays_disable[name]))


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.integers(1, 12), height=st.integers(1, 9), width=st.integers(1, 9), kernel=st.sampled_from([1, 3]),
       stride=st.sampled_from([1, 2]), pool=st.booleans(), seed=st.integers(0, 3))
def test_no_origin_agrees_after_the_permutation_and_sqnr_agrees_across_levels(tmp_path_factory, channels, height, width,
                                                                           kernel, stride, pool, seed):
    folder = tmp_path_factory.mktemp("geometry")
    found = _levels(folder, prelu_conv_model(channels, height, width, kernel=kernel, stride=stride, pool=pool, seed=seed), seed)
    arrays_all, _ = _raw(found["dumps"]["all"])
    arrays_disable, _ = _raw(found["dumps"]["disable"])
    tensors = found["diff"].tensors
    diverging = {n.key for n in tensors.nodes}
    for node in tensors.origins:
        a, b = arrays_all[node.key], arrays_disable[node.key]
        assert any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b)), f"origin {node.label} agrees"
    for key in set(arrays_all) & set(arrays_disable):  # tensors that agree are never named as diverging
        if all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(arrays_all[key], arrays_disable[key])):
            assert key not in diverging
    assert {"conv1", "conv2", "conv3"} <= set(_sqnr(found["errors"]["all"]))  # (ORT renames some PRelu outputs)
    assert _agree(found["errors"]["all"], found["errors"]["disable"]) >= 3


@pytest.mark.gpu
def test_cuda_nhwc_tensors_are_recorded_in_the_original_order_on_the_device(tmp_path):
    """With ``prefer_nhwc`` the CUDA EP runs the convs channels last: the relaid tensors go through the host
    (put back in NCHW) while the others are fingerprinted on the device; both fingerprint paths give the same
    records, and against the CPU at level disable an origin is only ever a tensor whose values differ."""
    from qconsist.inference.model import ModelSource
    from qconsist.inference.reader import load_dump
    from qconsist.store.run import Run

    model = prelu_conv_model(10, 10, 10)
    onnx.save(model, str(tmp_path / "model.onnx"))
    np.save(tmp_path / "samples.npy", np.random.default_rng(0).normal(0, 1, (SAMPLES, 3, 12, 12)).astype(np.float32))
    inputs = open_input_set(str(tmp_path / "samples.npy"), None, "x")
    cuda = ExecutionOptions("cuda", {"prefer_nhwc": True, "cudnn_conv_algo_search": "HEURISTIC"})
    runs = {}
    for key, options, where in (("device", cuda, "device"), ("host", cuda, "host"),
                                ("cpu", ExecutionOptions(graph_optimization_level="disable"), "host")):
        request = RunRequest(options, dump=True, raw=RawSelection.parse("all"), fingerprints=where)
        runs[key] = run_inference(ModelSource(tmp_path / "model.onnx"), inputs, request, tmp_path / "runs", run_id=key).run_dir
    index = json.loads((runs["device"] / "dump" / "index.json").read_text())["tensors"]
    assert any(t["how"] == "relayout" for t in index), [(t["name"], t["op_type"]) for t in index]
    device, host = (load_dump(Run.open(runs[key])) for key in ("device", "host"))
    exact = ["hash", "min", "max", "nan", "inf", "dtype"]  # the mean of floats may differ in its last bits
    raw_device, raw_host = _raw(runs["device"])[0], _raw(runs["host"])[0]
    # shapes are compared as shapes: each table numbers the shapes in the order it met them
    differing = [(s, index[c]["name"], index[c]["how"], field, bool(np.array_equal(raw_device[index[c]["original"]][s],
                                                                                   raw_host[index[c]["original"]][s])))
                 for s in range(SAMPLES) for c in range(len(index)) if index[c]["original"]
                 for field in (*exact, "shape")
                 if (device.shape(s, c) != host.shape(s, c) if field == "shape"
                     else not np.array_equal(device.table.record(s, c)[field], host.table.record(s, c)[field],
                                             equal_nan=field in ("min", "max")))]
    # (sample, tensor, how it was recorded, field, whether the two runs' raw arrays are equal)
    assert not differing, differing[:12]
    a, b = raw_device, _raw(runs["cpu"])[0]
    for node in diff_runs(runs["device"], runs["cpu"]).tensors.origins:
        assert any(not np.array_equal(x, y) for x, y in zip(a[node.key], b[node.key])), node.label
