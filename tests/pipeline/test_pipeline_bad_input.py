"""Bad input to ``qconsist pipeline run``: one line naming the problem, exit code 2, nothing left in runs/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from qconsist.cli import app


def _pipeline(folder: Path, model: str, data: str, extra: str = "") -> Path:
    path = folder / "bad.toml"
    path.write_text(f'[model]\nonnx = "{model}"\n[calibration]\ndata = "{data}"\n{extra}')
    return path


def _run(pipeline: Path, *args: str):
    result = CliRunner().invoke(app, ["pipeline", "run", str(pipeline), *args])
    runs = Path("runs")
    assert not runs.exists() or list(runs.iterdir()) == [], "a run directory was left behind"
    return result


def _relu_model(path: Path, opset: int, ir_version: int, broken: bool = False) -> Path:
    inputs = ["x_missing" if broken else "x"]
    graph = helper.make_graph(
        [helper.make_node("Relu", inputs, ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    path.write_bytes(model.SerializeToString())
    return path


def _expect(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr == f"error: {message}\n"


def test_missing_pipeline_file():
    _expect(_run(Path("nope.toml")), "pipeline file nope.toml does not exist")


def test_missing_model_file(small_models, tmp_path):
    pipeline = _pipeline(tmp_path, str(tmp_path / "missing.onnx"), str(small_models["arrays"]))
    _expect(_run(pipeline), f"model file {tmp_path / 'missing.onnx'} (onnx) does not exist")


def test_onnx_that_fails_the_checker(small_models, tmp_path):
    model = _relu_model(tmp_path / "broken.onnx", 17, 8, broken=True)
    result = _run(_pipeline(tmp_path, str(model), str(small_models["arrays"])))
    _expect(result, f"{model} fails the ONNX checker: Nodes in a graph must be topologically sorted, however input 'x_missing' of node: name: relu OpType: Relu is not output of any previous nodes.")


def _loads(opset: int, ir_version: int) -> bool:
    """Whether the installed onnxruntime loads a one-Relu model with this opset and IR version: asked of
    onnxruntime itself, so the tests below hold on every supported version."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - onnxruntime's Fail / InvalidGraph / InvalidProtobuf
        return False
    return True


def _newest(loads, start: int) -> int:
    newest = start
    while loads(newest + 1):
        newest += 1
    return newest


def test_unsupported_opset(small_models, tmp_path):
    newest = _newest(lambda opset: _loads(opset, 8), 17)  # ORT ≥ 1.20 loads opset 21; 1.31 to 26, 1.32 to 28
    model = _relu_model(tmp_path / "future.onnx", newest + 1, 8)
    result = _run(_pipeline(tmp_path, str(model), str(small_models["arrays"])))
    _expect(result, f"{model} uses ai.onnx opset {newest + 1}; onnxruntime {ort.__version__} supports up to opset {newest}")


def test_unsupported_ir_version(small_models, tmp_path):
    newest = _newest(lambda ir: _loads(17, ir), 8)  # ORT 1.31 loads IR 13, 1.32 IR 14
    model = _relu_model(tmp_path / "future_ir.onnx", 17, newest + 1)
    result = _run(_pipeline(tmp_path, str(model), str(small_models["arrays"])))
    if newest + 1 > onnx.IR_VERSION:  # the checker (onnx 1.23 knows IR 14) refuses it before onnxruntime is asked
        _expect(result, f"{model} fails the ONNX checker: Your model ir_version {newest + 1} is higher than the checker's ({onnx.IR_VERSION}).")
    else:
        _expect(result, f"onnxruntime {ort.__version__} cannot load {model}: "
                        f"Unsupported model IR version: {newest + 1}, max supported IR version: {newest}")


def test_input_shape_mismatch(small_models, tmp_path):
    np.save(tmp_path / "wrong.npy", np.zeros((4, 3, 9, 9), np.float32))
    result = _run(_pipeline(tmp_path, str(small_models["classifier"]), str(tmp_path / "wrong.npy")))
    _expect(result, "sample 000000: input 'x' has shape [1, 3, 9, 9], the model wants [1, 3, 8, 8]")


def test_empty_calibration_set(small_models, tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((0, 3, 8, 8), np.float32))
    result = _run(_pipeline(tmp_path, str(small_models["classifier"]), str(tmp_path / "empty.npy")))
    _expect(result, f"calibration set {tmp_path / 'empty.npy'} is empty")


def test_unreadable_image(small_models, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    extra = '[preprocess]\nresize = [8, 8]\n'
    result = _run(_pipeline(tmp_path, str(small_models["classifier"]), str(photos), extra))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: cannot read image {photos / 'broken.jpg'}: ")
    assert result.stderr.count("\n") == 1


def test_output_directory_not_writable(small_models, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    extra = f'runs_dir = "{blocker}/runs"\n'
    path = tmp_path / "bad.toml"
    path.write_text(extra + f'[model]\nonnx = "{small_models["classifier"]}"\n[calibration]\ndata = "{small_models["arrays"]}"\n')
    _expect(_run(path), f"cannot create run directory in {blocker}/runs: Not a directory")
    assert blocker.read_text() == "not a directory"


def test_unknown_config_key(small_models, tmp_path):
    pipeline = _pipeline(tmp_path, str(small_models["classifier"]), str(small_models["arrays"]), "[quantize]\nper_chanel = true\n")
    result = _run(pipeline)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {pipeline.resolve()}: unknown key 'quantize.per_chanel' (known in [quantize]: ")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("flag", [["--run-id", "../escape"]])
def test_invalid_run_id(small_models, tmp_path, flag):
    pipeline = _pipeline(tmp_path, str(small_models["classifier"]), str(small_models["arrays"]))
    _expect(_run(pipeline, *flag), "invalid run id '../escape': use letters, digits, '.', '_' and '-'")


def test_missing_caffemodel(tmp_path, small_models):
    (tmp_path / "deploy.prototxt").write_text('name: "x"\n')
    path = tmp_path / "bad.toml"
    path.write_text(
        f'[model]\nprototxt = "deploy.prototxt"\ncaffemodel = "weights.caffemodel"\n[calibration]\ndata = "{small_models["arrays"]}"\n'
    )
    _expect(_run(path), f"model file {tmp_path / 'weights.caffemodel'} (caffemodel) does not exist")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="checks the CPU-only refusal")
def test_cuda_calibration_without_cuda_exits_3(small_models, tmp_path):
    pipeline = _pipeline(tmp_path, str(small_models["classifier"]), str(small_models["arrays"]), 'provider = "cuda"\n')
    result = _run(pipeline)
    assert result.exit_code == 3
    assert result.stderr.startswith("error: execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime (")
    assert result.stderr.endswith('); for cuda install onnxruntime-gpu (qconsist[gpu]) on a machine with an NVIDIA GPU\n')


def test_calibration_count_beyond_the_set(small_models, tmp_path):
    pipeline = _pipeline(tmp_path, str(small_models["classifier"]), str(small_models["arrays"]), "count = 30\n")
    _expect(_run(pipeline), f"input set {small_models['arrays']} has 12 samples; asked for 0..29")
    pipeline = _pipeline(tmp_path, str(small_models["classifier"]), str(small_models["arrays"]), "offset = 12\n")
    _expect(_run(pipeline), f"calibration set {small_models['arrays']} has 12 samples; offset 12 leaves none")


def test_missing_calibration_data(small_models, tmp_path):
    pipeline = _pipeline(tmp_path, str(small_models["classifier"]), "no-such-photos")
    _expect(_run(pipeline), f"input set {tmp_path / 'no-such-photos'} does not exist")


def test_unknown_bundled_model(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nsource = "nope"\n[calibration]\ndata = "package:photos"\n')
    _expect(_run(path), "unknown model 'nope'; bundled models: ddddocr_det, ddddocr_ocr_quantized, fcn_head, fcn_skip, "
            "mtcnn_pnet, nudenet_320n, open_nsfw, ppocr_cls, ppocr_det, ppocr_rec, silero_vad")
