"""Calibrations that agree by chance: a calibrated tensor whose producer varies from run to run (issue 31 item 6).

On the CPU the varying producer is a real one: a ``RandomUniformLike`` without a seed draws anew on every run (a row
of ``qconsist.locate.nondeterminism``, kind "by design"). Its draws, below 1e-30, are added to a Relu's output:
they change the bytes wherever the Relu gave 0 but never the tensor's range as calibration uses it (min(0, min)
and the max), so every calibration gives the same quantized model — the FCN head's ``upscore`` on a GPU, where
``deconvolution3``'s last bits reach the range's extremes only sometimes. The check is the production code; only
its trigger is forced here (``producers=True``), since the default runs it on GPU execution providers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qconsist.calibration.producers import ProducerCheck, VaryingTensor
from qconsist.store.manifest import Manifest
from qconsist.store.runs import run_verdict
from qconsist.calibration.repeat import RepeatResult, repeat_calibration
from qconsist.inputs import open_input_set
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions


def noisy_model(path: Path) -> Path:
    """x -> conv1 -> relu -> add(relu, RandomUniformLike in [0, 1e-30)) = mixed -> conv2 -> y."""
    rng = np.random.default_rng(5)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((2, 4, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r"], name="relu"),
        helper.make_node("RandomUniformLike", ["r"], ["noise"], name="noise", low=0.0, high=1e-30),
        helper.make_node("Add", ["r", "noise"], ["mixed"], name="add"),
        helper.make_node("Conv", ["mixed", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _inputs(tmp_path: Path):
    np.save(tmp_path / "x.npy", np.random.default_rng(6).standard_normal((6, 3, 8, 8)).astype(np.float32))
    return open_input_set(tmp_path / "x.npy", None, "x")


def test_calibrations_that_agree_by_chance_are_named_with_the_varying_producer(tmp_path):
    model, inputs = noisy_model(tmp_path / "noisy.onnx"), _inputs(tmp_path)
    result = repeat_calibration(model, inputs, 3, QuantizeOptions(op_types=("Conv",)), CalibrationOptions(), producers=True)
    assert result.agree and len(set(result.md5s)) == 1  # the quantized models are byte-identical
    check = result.producers
    assert check is not None and (check.provider, check.samples, check.runs) == ("cpu", 4, 3)
    mixed = next(v for v in check.varying if v.tensor == "mixed")
    assert (mixed.producer, mixed.op_type, mixed.origins, mixed.samples) == ("add", "Add", ("noise",), 4)
    assert "x" not in {v.tensor for v in check.varying}  # a graph input never varies
    assert result.by_chance and not result.passed and not bool(result)
    assert result.verdict() == (
        "3 calibrations agree, but `mixed`'s range comes from `add`, whose output varies between runs on this EP "
        "(from `noise`): the md5 can still change; pin or determinize")
    assert check.evidence() == f"{check.checked} calibrated tensor(s) compared over 3 runs of 4 calibration step(s) in one cpu session"
    again = RepeatResult.from_json(result.to_json())  # the record the pipeline keeps and the gate reads
    assert again.by_chance and again.producers == check and again.verdict() == result.verdict()
    # `runs list` and `inspect` judge a pipeline run from its manifest alone: the record says it did not pass
    assert result.to_json()["passed"] is False
    manifest = Manifest(kind="pipeline", sections={"calib_repeat": result.to_json()})
    assert run_verdict(manifest) == "FAIL (calibration agreed by chance)"
    old = {k: v for k, v in result.to_json().items() if k != "passed"}  # a record written before `passed` was
    assert run_verdict(Manifest(kind="pipeline", sections={"calib_repeat": old})) == "PASS"


def test_the_check_runs_on_gpu_providers_only_by_default(tmp_path):
    model, inputs = noisy_model(tmp_path / "noisy.onnx"), _inputs(tmp_path)
    result = repeat_calibration(model, inputs, 2, QuantizeOptions(op_types=("Conv",)), CalibrationOptions())
    assert result.agree and result.producers is None and result.passed
    assert result.verdict() == f"2 calibrations agree: md5 {result.runs[0].md5}"


def test_a_deterministic_model_has_no_varying_producer(small_models):
    inputs = open_input_set(small_models["arrays"])
    result = repeat_calibration(small_models["classifier"], inputs, 2, producers=True)
    assert result.producers is not None and result.producers.stable and result.producers.checked > 0
    assert result.passed and result.verdict() == f"2 calibrations agree: md5 {result.runs[0].md5}"


def test_a_variation_that_starts_upstream_names_its_origin(tmp_path):
    """``conv2``'s output varies too wherever the noise reaches it; its producer is conv2, the origin the noise."""
    model, inputs = noisy_model(tmp_path / "noisy.onnx"), _inputs(tmp_path)
    found_check = repeat_calibration(model, inputs, 2, QuantizeOptions(op_types=("Conv",)), CalibrationOptions(),
                               producers=True).producers
    assert found_check is not None and found_check.varying
    for found in found_check.varying:
        assert found.origins == ("noise",)
    check = ProducerCheck("cuda", 3, 3, 4, [VaryingTensor("upscore", "deconvolution3", "ConvTranspose", ("deconvolution3",), 3)])
    assert check.sentence() == ("`upscore`'s range comes from `deconvolution3`, whose output varies between runs on this EP: "
                                "the md5 can still change; pin or determinize")
