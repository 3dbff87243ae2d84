"""Shared fixtures: CLI isolation (every test) and one complete open_nsfw pipeline run (per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OPEN_NSFW_PIPELINE = REPO / "pipelines" / "open_nsfw.toml"


@pytest.fixture(autouse=True)
def cli_isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test runs in its own temporary working directory, without colour, at a fixed width."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("CI", raising=False)
    return work


@pytest.fixture(scope="session")
def nsfw_run(tmp_path_factory: pytest.TempPathFactory):
    """A complete run of pipelines/open_nsfw.toml in a temporary runs directory: a ``PipelineResult``.

    ``nsfw_run.path`` is the run directory (``convert/``, ``optimize/``, ``quantize/`` models and
    ``manifest.json``); ``nsfw_run.artifacts[stage]`` their hashes; ``nsfw_run.repeat`` the repeated
    calibration (3 runs).
    """
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    runs = tmp_path_factory.mktemp("nsfw-runs")
    return run_pipeline(load_pipeline(OPEN_NSFW_PIPELINE), runs_dir=runs, run_id="open_nsfw-fixture")


# --- small ONNX models built in code (pipeline, stage and calibration tests) -----------------------------


def build_pad_pool_model(path: Path, pad_value: float = float("-inf")) -> Path:
    """Conv → Relu → Pad(constant ``pad_value``) → MaxPool on a 1×3×8×8 input: the pattern caffe2onnx
    emits for Caffe's padded max pooling. With -inf, calibration yields infinite scales."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "B"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        numpy_helper.from_array(np.array(pad_value, np.float32), "pad_value"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Pad", ["relu", "pads", "pad_value"], ["padded"], name="pad", mode="constant"),
        helper.make_node("MaxPool", ["padded"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes, "pad_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def build_classifier_model(path: Path) -> Path:
    """Conv → Relu → GlobalAveragePool → Flatten → Gemm → Softmax on a 1×3×8×8 input, 5 classes."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    initializers = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "conv_b"),
        numpy_helper.from_array(rng.normal(0, 0.5, (5, 8)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (5,)).astype(np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 5])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def save_arrays(path: Path, count: int, seed: int, shape: tuple[int, ...] = (3, 8, 8)) -> Path:
    """``count`` seeded normal samples stacked in a .npy file."""
    import numpy as np

    np.save(path, np.random.default_rng(seed).normal(0, 1, (count, *shape)).astype(np.float32))
    return path


@pytest.fixture(scope="session")
def small_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small ONNX models and calibration arrays built in code: ``pad_pool`` (-inf Pad), ``pad_pool_zero``
    (a 0 Pad), ``classifier``, ``arrays`` (12 samples 3×8×8) and ``arrays_b`` (12 other samples)."""
    folder = tmp_path_factory.mktemp("small-models")
    return {
        "pad_pool": build_pad_pool_model(folder / "pad_pool.onnx"),
        "pad_pool_zero": build_pad_pool_model(folder / "pad_pool_zero.onnx", 0.0),
        "classifier": build_classifier_model(folder / "classifier.onnx"),
        "arrays": save_arrays(folder / "arrays.npy", 12, seed=2),
        "arrays_b": save_arrays(folder / "arrays_b.npy", 12, seed=3),
    }
