"""Any opset the installed onnxruntime runs can be quantized and observed (issue 19, item 2), on a real opset-12
model: MTCNN's P-Net as keras2onnx exported it (models/mtcnn_pnet.toml)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import pytest

from qconsist.errors import ConfigError
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inference.dump import reloadable
from qconsist.inference.session import create_session
from qconsist.inputs import open_input_set
from qconsist.models import fetch_model
from qconsist.pipeline.config import load_pipeline, parse_pipeline
from qconsist.pipeline.runner import run_pipeline
from qconsist.stages.convert import ConvertOptions

pytestmark = pytest.mark.slow
PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "mtcnn_pnet.toml"


@pytest.fixture(scope="module")
def pnet_run(tmp_path_factory):
    config = load_pipeline(PIPELINE)
    return run_pipeline(dataclasses.replace(config, calibration=dataclasses.replace(config.calibration, repeat=1)),
                        runs_dir=tmp_path_factory.mktemp("pnet-runs"), run_id="pnet")


def test_the_entry_is_an_opset_12_export():
    model = onnx.load(str(fetch_model("mtcnn_pnet")["onnx"]))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [12]
    assert model.producer_name == "keras2onnx"


def test_per_channel_qdq_below_opset_13_names_the_setting(tmp_path):
    config = load_pipeline(PIPELINE)
    stages = {**config.stages, "convert": ConvertOptions()}  # the entry's own opset, 12
    with pytest.raises(ConfigError, match=r"^quantize.per_channel with format QDQ needs ai.onnx opset 13 \(DequantizeLinear's axis\); "
                                          r"the model to quantize \(optimize/model.onnx\) has ai.onnx opset 12: set \[convert\] opset = 13 in the pipeline file"):
        run_pipeline(dataclasses.replace(config, stages=stages), runs_dir=tmp_path, run_id="refused")
    assert not (tmp_path / "refused").exists()


def test_convert_opset_upgrades_an_onnx_entry_checked_against_it(pnet_run):
    convert = json.loads((pnet_run.path / "manifest.json").read_text())["stages"][0]
    assert convert["params"]["opset"] == 13 and convert["params"]["opset_of_entry"] == 12
    assert convert["params"]["tool"].startswith("onnx.version_converter")
    check = convert["checks"]["outputs_vs_entry"]
    assert check["passed"] and check["max_abs_diff"] == 0.0  # keras2onnx's ops are the same at 13
    upgraded = onnx.load(str(pnet_run.path / "convert" / "model.onnx"))
    assert [o.version for o in upgraded.opset_import if o.domain in ("", "ai.onnx")] == [13]
    quantized = onnx.load(str(pnet_run.path / "quantize" / "model.onnx"))
    assert any(a.name == "axis" for n in quantized.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute)


@pytest.mark.parametrize("level", ["all", "extended", "basic", "disable"])
def test_the_quantized_model_is_dumped_faithfully_at_every_level(pnet_run, tmp_path, level):
    source = resolve_model(pnet_run.path)
    photos = open_input_set("package:photos", load_pipeline(PIPELINE).preprocess, "input_1").subset(12, 3)
    result = run_inference(source, photos, RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True), tmp_path)
    assert result.dump.faithful and result.dump.samples_checked == 3


def test_a_saved_graph_onnxruntime_cannot_reload_is_raised_to_an_opset_it_loads(pnet_run, tmp_path):
    """The file the issue met: ORT's optimized graph of a per-channel QDQ model stamped opset 12, its DequantizeLinear
    with an axis. The repair raises it to 13; its outputs equal the production session's bit for bit."""
    quantized = pnet_run.path / "quantize" / "model.onnx"
    options = ExecutionOptions(graph_optimization_level="all")
    saved = tmp_path / "optimized.onnx"
    create_session(quantized, options, optimized_model_filepath=saved)
    broken = onnx.load(str(saved))
    for opset in broken.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = 12
    onnx.save(broken, str(saved))
    repaired, note = reloadable(broken, saved, options)
    assert note == "ORT's saved graph raised from opset 12 to 13 (onnx.version_converter): ORT could not reload it"
    assert [o.version for o in onnx.load(str(saved)).opset_import if o.domain == ""] == [13]
    photos = open_input_set("package:photos", load_pipeline(PIPELINE).preprocess, "input_1").subset(12, 3)
    production = create_session(quantized, options)
    reloaded = create_session(repaired.SerializeToString(), options, level="disable")
    for index in range(len(photos)):
        sample = photos.sample(index)
        for a, b in zip(production.run(None, sample), reloaded.run(None, sample)):
            assert a.tobytes() == b.tobytes()


def test_an_onnx_entry_opset_is_only_raised(tmp_path):
    from onnx_builders import build_classifier_model, save_arrays

    model, arrays = build_classifier_model(tmp_path / "m.onnx"), save_arrays(tmp_path / "a.npy", 4, seed=0)  # opset 17
    config = parse_pipeline({"model": {"onnx": str(model)}, "convert": {"opset": 13}, "calibration": {"data": str(arrays)}},
                            tmp_path / "p.toml")
    with pytest.raises(ConfigError, match=r"^convert.opset 13 is older than .*m.onnx's opset 17: an ONNX entry's opset can only be raised"):
        run_pipeline(config, runs_dir=tmp_path / "runs", run_id="older")
