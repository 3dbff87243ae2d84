"""Two real models of kinds the rest of the corpus lacks (issue 27, last "Done when" item), through `diff` of levels
all and disable and `diff --replay`, every figure checked against plain onnxruntime and numpy:

| model | family, exporter, opset |
| --- | --- |
| ppocr_rec | PaddleOCR PP-OCRv4 text recogniser (SVTR-LCNet, CTC over 6,625 characters, dynamic width), Paddle2ONNX, 12 |
| silero_vad | Silero VAD v5 (If per sample rate, an LSTM state input and output, an int64 scalar input), spox, 16 |

The recogniser goes through its pipeline (pipelines/ppocr_rec.toml) and its quantized model is dumped at both
levels; the voice-activity model is observed as it is (its convolutions and LSTM live inside the If's branches),
fed a folder of .npz windows exactly as they are (tests/audio_windows.py). In both, ORT hides the tensor where the
difference starts (a fused QLinearConv; the If's branches), so the findings are spans, never origins; the raw
tensors the replay needs are captured with the commands `diff --replay` prints, and each span is confirmed in
isolation with the figures numpy measures on the raw tensors and onnxruntime computes on onnx's own extract of the
span (onnx.utils.extract_model, not qconsist's isolate)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from audio_windows import vad_session, vad_windows
from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.explain.confirm import confirm_origins
from qconsist.diff.replay import ReplayOutcome
from qconsist.inputs import open_input_set
from qconsist.models import fetch_model
from qconsist.errors import QconsistError
from qconsist.pipeline.config import load_pipeline, parse_pipeline
from qconsist.pipeline.runner import run_pipeline

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
PHOTOS = (12, 2)  # evaluation photos dumped (offset, count)
WINDOWS = (14, 4)  # audio windows dumped: two of faint noise, then the onset of the voiced sound


def _cli(*args: str) -> str:
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code in (0, 1), out.output
    return out.output


def _capture(command: str, runs: Path, run_id: str) -> Path:
    """Run a `qconsist run` command as `diff` printed it (its run directory and name added)."""
    args = shlex.split(command)
    assert args[:2] == ["qconsist", "run"] and "--dump" in args and "--raw" in args, command
    out = CliRunner().invoke(app, [*args[1:], "--runs-dir", str(runs), "--run-id", run_id])
    assert out.exit_code == 0, out.output
    return runs / run_id


def _capture_commands(output: str, label: str) -> list[str]:
    """The two capture commands printed under `replay LABEL: cannot replay: ...`."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"replay {label}: cannot replay: no raw tensors of "))
    return [line.strip() for line in lines[start + 1:start + 3]]


def _raw(run_dir: Path, tensor: str) -> dict[int, np.ndarray]:
    """A tensor's raw arrays by sample, read with numpy from the run's dump files alone."""
    index = json.loads((run_dir / "dump" / "index.json").read_text())
    column = next(i for i, t in enumerate(index["tensors"]) if t["original"] == tensor)
    found = {}
    for path in sorted((run_dir / "dump" / "raw").glob("*.npz")):
        with np.load(path) as npz:
            if f"t{column}" in npz.files:
                found[int(path.stem)] = npz[f"t{column}"]
    return found


def _session(model: onnx.ModelProto | Path, level: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[level]
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _replay_line(label: str, inputs: str, nodes: str, differing: int, samples: int, mismatched: int, elements: int,
                 greatest: float) -> str:
    return (f"replay {label}: confirmed in isolation: fed identical inputs ({inputs}), its {nodes} compute different "
            f"outputs under the two runs' options (A: --ep cpu --level all; B: --ep cpu --level disable): "
            f"{differing}/{samples} samples differ, mismatched elements {mismatched} / {elements} "
            f"({100 * mismatched / elements:.2f}%), greatest abs difference {greatest:.6g}")


def test_both_are_fetched_and_verified():
    import hashlib
    import tomllib

    for name, member, license_ in (("ppocr_rec", "ch_PP-OCRv4_rec_infer.onnx", "Apache-2.0"), ("silero_vad", "silero_vad.onnx", "MIT")):
        path = fetch_model(name)["onnx"]
        description = tomllib.loads((REPO / "models" / f"{name}.toml").read_text())
        assert path.name == member and description["license"].startswith(license_)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == description["files"]["onnx"]["sha256"]


# --- the text recogniser: a sequence output, quantized QDQ ----------------------------------------------------


@pytest.fixture(scope="module")
def recogniser(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ppocr_rec")
    config = load_pipeline(REPO / "pipelines" / "ppocr_rec.toml")
    run = run_pipeline(config, runs_dir=folder, run_id="ppocr_rec")
    offset, count = PHOTOS
    dumps = {}
    for level in ("all", "disable"):
        _cli("run", run.path, "--inputs", "package:photos", "--offset", offset, "--count", count, "--level", level,
             "--dump", "--runs-dir", folder, "--run-id", f"rec-{level}")
        dumps[level] = folder / f"rec-{level}"
    photos = open_input_set("package:photos", config.preprocess, "x").subset(offset, count)
    return {"run": run, "folder": folder, "dumps": dumps, "photos": [photos.sample(i)["x"] for i in range(count)]}


def test_the_recogniser_is_a_sequence_model_with_a_dynamic_width(recogniser):
    path = fetch_model("ppocr_rec")["onnx"]
    model = onnx.load(str(path))
    assert path.name == "ch_PP-OCRv4_rec_infer.onnx" and len(model.graph.node) == 860
    assert [o.version for o in model.opset_import if o.domain == ""] == [12]
    assert [d.dim_value or d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == [
        "p2o.DynamicDimension.0", 3, "?", "p2o.DynamicDimension.1"]
    assert {op.op_type for op in model.graph.node} >= {"MatMul", "Softmax", "ReduceMean", "Sqrt", "Conv"}  # attention, LayerNorm
    # 48x320 lines give 40 positions of 6,625 characters
    quantized = recogniser["run"].path / "quantize" / "model.onnx"
    assert _session(quantized, "disable").run(None, {"x": recogniser["photos"][0]})[0].shape == (1, 40, 6625)


def test_at_level_disable_every_tensor_of_the_recogniser_is_the_original_s(recogniser):
    """ORT runs the original graph at level disable, but its EnsureUniqueDQForNodeUnit gives each consumer of a
    DequantizeLinear its own copy ('.../duplicated'), and its saved graph writes default attributes (QuantizeLinear's
    axis 1) in its own order: 100 tensors of the LayerNorm region, read through such copies, were "layout unknown"
    and left out of every diff. The copies are recognised as the original's value."""
    index = json.loads((recogniser["dumps"]["disable"] / "dump" / "index.json").read_text())
    quantized = onnx.load(str(recogniser["run"].path / "quantize" / "model.onnx"))
    hows = {}
    for tensor in index["tensors"]:
        hows.setdefault(tensor["how"], []).append(tensor)
    assert sorted(hows) == ["internal", "same"] and len(hows["same"]) == len(quantized.graph.node) == 1305
    optimized = {n.output[0]: n for n in onnx.load(str(recogniser["dumps"]["disable"] / "dump" / "optimized.onnx")).graph.node}
    copies = [optimized[t["name"]] for t in hows["internal"]]
    assert len(copies) == 89 and {n.op_type for n in copies} == {"DequantizeLinear"}
    assert all(n.output[0].split("/duplicated")[0] in {t["original"] for t in hows["same"]} for n in copies)


def test_the_recogniser_levels_all_and_disable_name_spans_confirmed_by_replay(recogniser, tmp_path):
    a, b = recogniser["dumps"]["all"], recogniser["dumps"]["disable"]
    result = diff_runs(a, b)
    tensors = result.tensors
    # ORT fuses DequantizeLinear -> Conv -> QuantizeLinear into a QLinearConv at level all: the Conv's input and
    # output are not observed there, so no origin is proven; each finding is a span ending at a DequantizeLinear
    assert tensors.origins == [] and len(tensors.spans) >= 1
    quantized = onnx.load(str(recogniser["run"].path / "quantize" / "model.onnx"))
    ops = {n.name: n.op_type for n in quantized.graph.node}
    for span in tensors.spans:
        assert span.label.endswith("_DequantizeLinear") and span.span[-1] == span.label, span.span
        assert [ops[n] for n in span.span].count("Conv") == 1 and len(span.inputs) == 1, span.span
    # no raw tensors yet: each span cannot be replayed, and diff prints the commands that record its inputs
    output = _cli("diff", "--replay", a, b)
    final = [_session(recogniser["run"].path / "quantize" / "model.onnx", level).run(None, {"x": x})[0]
             for level in ("all", "disable") for x in recogniser["photos"]]
    greatest = max(float(np.abs(final[i].astype(np.float64) - final[i + 2]).max()) for i in range(2))
    differing = sum(not np.array_equal(final[i], final[i + 2]) for i in range(2))
    assert f"final outputs: {differing}/2 samples differ, greatest abs difference {greatest:.6g}" in output
    for span in tensors.spans:
        commands = _capture_commands(output, span.label)
        assert [re.search(r"--level (\w+)", c).group(1) for c in commands] == ["all", "disable"]
        runs = [_capture(c, tmp_path / "captured", f"{span.label}-{level}") for c, level in zip(commands, ("all", "disable"))]
        captured = diff_runs(*runs)
        replays = {r.label: r for r in confirm_origins(captured)}
        replay = replays[span.label]
        (observed,) = span.inputs
        tensor = f"{span.label}_Output"
        fed, outs = (_raw(run, observed) for run in runs), [_raw(run, tensor) for run in runs]
        fed_a, fed_b = fed
        samples = sorted(span.origin_samples)
        for s in samples:  # the span's observed input is bit-identical in both runs (numpy on the raw tensors)
            assert fed_a[s].dtype == fed_b[s].dtype and fed_a[s].tobytes() == fed_b[s].tobytes()
        # onnx's own extract of the span, run by plain onnxruntime at each level on the recorded input
        extracted = tmp_path / f"{span.label}.onnx"
        onnx.utils.extract_model(str(recogniser["run"].path / "quantize" / "model.onnx"), str(extracted), [observed], [tensor])
        alone = [[_session(extracted, level).run(None, {observed: fed_a[s]})[0] for s in samples] for level in ("all", "disable")]
        for side, recorded in zip(alone, outs):  # what each run recorded in the full model
            assert all(np.array_equal(x, recorded[s]) for x, s in zip(side, samples))
        mismatched = sum(int((x != y).sum()) for x, y in zip(*alone))
        elements = sum(x.size for x in alone[0])
        greatest = max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(*alone))
        assert mismatched > 0, span.label
        assert replay.outcome is ReplayOutcome.CONFIRMED and replay.nodes == span.span and replay.inputs == [observed]
        assert (replay.samples, replay.mismatched, replay.elements, replay.max_abs) == (samples, mismatched, elements, greatest)
        assert [side.recorded for side in replay.sides] == ["matches", "matches"]
        nodes = f"{len(span.span)} nodes ({', '.join(span.span[:3])}, ...)"
        line = _replay_line(span.label, observed, nodes, len(samples), len(samples), mismatched, elements, greatest)
        assert line in _cli("diff", "--replay", *runs).splitlines()


# --- the voice-activity model: If branches, a state input and output, an int64 scalar ------------------------


@pytest.fixture(scope="module")
def vad(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("silero_vad")
    model = fetch_model("silero_vad")["onnx"]
    first, count = WINDOWS
    feeds = vad_windows(model, folder / "windows", first, count)
    dumps = {}
    for level in ("all", "disable"):
        _cli("run", model, "--inputs", folder / "windows", "--level", level, "--dump", "--runs-dir", folder,
             "--run-id", f"vad-{level}")
        dumps[level] = folder / f"vad-{level}"
    reference = {level: [vad_session(model, level).run(["output", "stateN"], f) for f in feeds] for level in ("all", "disable")}
    return {"model": model, "folder": folder, "feeds": feeds, "dumps": dumps, "reference": reference}


def test_the_voice_activity_model_is_fed_its_windows_exactly(vad):
    model = onnx.load(str(vad["model"]))
    assert model.producer_name == "spox" and [o.version for o in model.opset_import if o.domain == ""] == [16]
    assert [n.op_type for n in model.graph.node] == ["Constant", "Equal", "If", "Identity", "Identity"]
    assert [len(a.g.node) for a in model.graph.node[2].attribute] == [113, 113]
    # the stored outputs are what plain onnxruntime gives each window with its state and the scalar rate
    for level, run in vad["dumps"].items():
        for index, name in enumerate(("output", "stateN")):
            stored = np.load(run / "outputs" / f"o{index}.npy")
            assert stored.shape == ((4, 1, 1) if name == "output" else (4, 2, 1, 128))
            assert all(np.array_equal(stored[s], vad["reference"][level][s][index]) for s in range(4)), (level, name)
    # speech probability: faint noise, then the voiced onset
    probability = [float(r[0][0, 0]) for r in vad["reference"]["disable"]]
    assert probability[0] < 0.05 and probability[1] < 0.05 and probability[2] > 0.9 and probability[3] > 0.9


def test_a_pipeline_says_why_it_cannot_quantize_the_voice_activity_model(vad, tmp_path):
    config = parse_pipeline({"model": {"source": "silero_vad"}, "calibration": {"data": str(vad["folder"] / "windows")},
                             "quantize": {"format": "QDQ"}}, tmp_path / "vad.toml")
    with pytest.raises(QconsistError, match=r"^quantize_static quantized nothing: the model has no operator onnxruntime "
                                            r"quantizes \(its operators: Equal, If\)$"):
        run_pipeline(config, runs_dir=tmp_path / "runs", run_id="vad")


def test_the_voice_activity_model_levels_name_the_if_as_spans_confirmed_by_replay(vad, tmp_path):
    a, b = vad["dumps"]["all"], vad["dumps"]["disable"]
    reference = vad["reference"]
    result = diff_runs(a, b)
    tensors = result.tensors
    # at level all ORT removes the Identity nodes (the If writes output and stateN), so the If's own outputs are
    # observed at level disable only: each finding is the span If_0 + its Identity, read from the branches
    differs = {name: [s for s in range(4) if not np.array_equal(reference["all"][s][i], reference["disable"][s][i])]
               for i, name in enumerate(("output", "stateN"))}
    assert tensors.origins == []
    assert [(s.label, s.span, s.origin_samples, s.inputs, s.given) for s in tensors.spans] == [
        ("Introduce_0_id0", ["If_0", "Introduce_0_id0"], differs["output"], ["Equal_0_C"], ["input", "state"]),
        ("Introduce_0_id1", ["If_0", "Introduce_0_id1"], differs["stateN"], ["Equal_0_C"], ["input", "state"])]
    assert differs["stateN"] == [0, 1, 2, 3] and len(differs["output"]) >= 1
    # no raw tensors: the replay prints the commands that record them; they run as printed
    output = _cli("diff", "--replay", a, b)
    for span in tensors.spans:
        commands = _capture_commands(output, span.label)
        runs = [_capture(c, tmp_path / "captured", f"{span.label}-{level}") for c, level in zip(commands, ("all", "disable"))]
        replay = {r.label: r for r in confirm_origins(diff_runs(*runs))}[span.label]
        samples = span.origin_samples
        # the If replayed alone computes both its outputs: compared with plain onnxruntime on the whole model
        mismatched = sum(int((reference["all"][s][i] != reference["disable"][s][i]).sum()) for s in samples for i in range(2))
        greatest = max(float(np.abs(reference["all"][s][i].astype(np.float64) - reference["disable"][s][i]).max())
                       for s in samples for i in range(2))
        assert replay.outcome is ReplayOutcome.CONFIRMED and replay.nodes == span.span
        assert (replay.samples, replay.mismatched, replay.elements, replay.max_abs) == (samples, mismatched, 257 * len(samples), greatest)
        assert replay.sources == {"Equal_0_C": "runs A and B (bit-identical)", "input": "the input set, opened again (digest checked)",
                                  "state": "the input set, opened again (digest checked)"}
        assert [side.recorded for side in replay.sides] == ["matches", "matches"]
        line = _replay_line(span.label, "Equal_0_C, input, state", f"2 nodes ({', '.join(span.span)})", len(samples),
                            len(samples), mismatched, 257 * len(samples), greatest)
        assert line in _cli("diff", "--replay", *runs).splitlines()
