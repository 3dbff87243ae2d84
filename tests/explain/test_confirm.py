"""``qconsist diff --replay`` on runs of a model built here (Relu -> Conv -> BatchNormalization, 16 -> 32
channels on 12x12): at level all onnxruntime folds the BatchNormalization into the Conv and runs it in its NCHWc
layout, so the Conv's output is observed only at level disable and the origin is the span conv + bn, fed the
Relu's output. Every figure the replay prints is checked against numpy on the raw tensors the runs kept."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from isa_models import blocked_conv_model
from qconsist.cli import app
from qconsist.diff import DiffResult, diff_runs
from qconsist.diff.replay import ReplayOutcome
from qconsist.errors import ConfigError
from qconsist.explain.confirm import confirm_origins, replay_origin, span_nodes
from qconsist.store.run import Run
from qconsist.store.serde import encode, loads

SAMPLES = 3


@pytest.fixture(scope="module")
def replay_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model and its inputs; dumps at level all and disable without raw tensors; a level-disable dump
    keeping r, c and y raw; a level-all dump with the NCHWc transformer switched off keeping r and y raw."""
    from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inputs import open_input_set

    folder = tmp_path_factory.mktemp("replay-runs")
    out = {"model": blocked_conv_model(folder / "relu_conv_bn.onnx"), "inputs": folder / "inputs.npy", "runs": folder / "runs"}
    np.save(out["inputs"], np.random.default_rng(3).normal(0, 1, (SAMPLES, 16, 12, 12)).astype(np.float32))
    source, inputs = resolve_model(out["model"]), open_input_set(out["inputs"], None, "input")
    for key, options, raw in (
        ("all", ExecutionOptions(graph_optimization_level="all"), "none"),
        ("disable", ExecutionOptions(graph_optimization_level="disable"), "none"),
        ("disable-c", ExecutionOptions(graph_optimization_level="disable"), "r,c,y"),
        ("nchwc-off", ExecutionOptions(disabled_optimizers=("NchwcTransformer",)), "r,y"),
    ):
        request = RunRequest(options, dump=True, raw=RawSelection.parse(raw))
        out[key] = run_inference(source, inputs, request, out["runs"], run_id=key).run_dir
    return out


def _raw(run_dir: Path, tensor: str) -> list[np.ndarray]:
    """A tensor's raw arrays, sample by sample, read with numpy from the run's dump files alone."""
    index = json.loads((run_dir / "dump" / "index.json").read_text())
    column = next(i for i, t in enumerate(index["tensors"]) if t["original"] == tensor)
    return [np.load(run_dir / "dump" / "raw" / f"{s:06d}.npz")[f"t{column}"] for s in range(SAMPLES)]


def _expected(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[list[int], int, int, float]:
    differing = [s for s, (x, y) in enumerate(zip(a, b)) if not np.array_equal(x, y)]
    mismatched = sum(int((x != y).sum()) for x, y in zip(a, b))
    greatest = max(float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max()) for x, y in zip(a, b))
    return differing, mismatched, sum(x.size for x in a), greatest


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()[:16]


def _capture(command: str, run_id: str, runs: Path) -> Path:
    """Run a command ``diff`` printed, as printed (its run directory and name added)."""
    args = shlex.split(command)
    assert args[:2] == ["qconsist", "run"]
    out = CliRunner().invoke(app, [*args[1:], "--runs-dir", str(runs), "--run-id", run_id])
    assert out.exit_code == 0, out.output
    return runs / run_id


def test_an_origin_without_raw_inputs_cannot_be_replayed_and_the_command_is_printed(replay_runs):
    all_, disable = replay_runs["all"], replay_runs["disable"]
    out = CliRunner().invoke(app, ["diff", "--replay", str(all_), str(disable)])
    assert out.exit_code == 1, out.output
    model, inputs = replay_runs["model"], replay_runs["inputs"]
    commands = [f"qconsist run {model} --inputs {inputs} --ep cpu --level {level} --offset 0 --count 3 --dump --raw r,y"
                for level in ("all", "disable")]
    lines = out.output.splitlines()
    start = lines.index("replay bn: cannot replay: no raw tensors of r in samples 0, 1, 2; record them with the capture "
                        "commands (run --dump --raw) and diff the new runs")
    assert lines[start + 1:start + 3] == [f"  {c}" for c in commands]
    data = loads(CliRunner().invoke(app, ["diff", "--replay", "--json", str(all_), str(disable)]).output)
    (replay,) = data["replays"]
    assert replay["outcome"] == "cannot replay" and replay["confirmed"] is False
    assert replay["nodes"] == ["conv", "bn"] and replay["inputs"] == ["r"] and replay["outputs"] == ["y"]
    assert replay["capture"] == commands
    assert encode(DiffResult.from_json(data)) == encode(data)


def test_the_printed_commands_record_the_inputs_and_the_origin_is_confirmed_in_isolation(replay_runs, tmp_path):
    first = diff_runs(replay_runs["all"], replay_runs["disable"])
    (cannot,) = confirm_origins(first)
    runs = tmp_path / "captured"
    a, b = (_capture(c, name, runs) for c, name in zip(cannot.capture, ("all-raw", "disable-raw")))
    out = CliRunner().invoke(app, ["diff", "--replay", str(a), str(b)])
    assert out.exit_code == 1, out.output
    ya, yb = _raw(a, "y"), _raw(b, "y")
    differing, mismatched, elements, greatest = _expected(ya, yb)
    assert differing == [0, 1, 2] and mismatched > 0
    assert (
        f"replay bn: confirmed in isolation: fed identical inputs (r), its 2 nodes (conv, bn) compute different outputs "
        f"under the two runs' options (A: --ep cpu --level all; B: --ep cpu --level disable): 3/3 samples differ, "
        f"mismatched elements {mismatched} / {elements} ({100 * mismatched / elements:.2f}%), greatest abs difference "
        f"{greatest:.6g}"
    ) in out.output.splitlines()
    assert "  input r: runs A and B (bit-identical)" in out.output.splitlines()
    assert "  under A's options the replay matches what run A recorded" in out.output.splitlines()
    assert "  under B's options the replay matches what run B recorded" in out.output.splitlines()
    result = diff_runs(a, b)
    (replay,) = confirm_origins(result, limit=2)
    assert replay.outcome is ReplayOutcome.CONFIRMED and replay.confirmed
    assert replay.samples == [0, 1] and replay.differing == [0, 1]
    assert replay.mismatched == sum(int((x != y).sum()) for x, y in zip(ya[:2], yb[:2]))
    assert [side.hashes for side in replay.sides] == [[_digest(x) for x in ya[:2]], [_digest(y) for y in yb[:2]]]
    assert [side.options.graph_optimization_level.value for side in replay.sides] == ["all", "disable"]
    assert result.replays == [replay]


def test_a_switched_off_transformer_changes_the_node_itself(replay_runs):
    """Level all with and without the NCHWc transformer: both fold bn into conv, only one runs it in NCHWc
    blocks; the span replayed alone under each run's options computes what each run recorded."""
    result = diff_runs(replay_runs["nchwc-off"], _capture_all(replay_runs))
    (replay,) = confirm_origins(result)
    assert replay.outcome is ReplayOutcome.CONFIRMED and replay.nodes == ["conv", "bn"]
    assert [side.options.disabled_optimizers for side in replay.sides] == [("NchwcTransformer",), ()]
    assert "(A: --ep cpu --level all --disable-optimizer NchwcTransformer; B: --ep cpu --level all)" in replay.summary()
    assert [side.recorded for side in replay.sides] == ["matches", "matches"]
    differing, mismatched, elements, greatest = _expected(_raw(replay_runs["nchwc-off"], "y"), _raw(replay_runs["all-raw"], "y"))
    assert (replay.differing, replay.mismatched, replay.elements, replay.max_abs) == (differing, mismatched, elements, greatest)


def _capture_all(replay_runs) -> Path:
    """A level-all dump keeping r and y raw (made once for the module)."""
    if "all-raw" not in replay_runs:
        from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
        from qconsist.inputs import open_input_set

        request = RunRequest(ExecutionOptions(graph_optimization_level="all"), dump=True, raw=RawSelection.parse("r,y"))
        replay_runs["all-raw"] = run_inference(resolve_model(replay_runs["model"]),
                                               open_input_set(replay_runs["inputs"], None, "input"), request,
                                               replay_runs["runs"], run_id="all-raw").run_dir
    return replay_runs["all-raw"]


def test_the_fused_node_alone_does_not_reproduce(replay_runs):
    """bn alone, fed the Conv output run B recorded (run A never computes it: the fusion), computes the same bits
    under both options: the difference at level all is the fusion's."""
    a, b = Run.open(_capture_all(replay_runs)), Run.open(replay_runs["disable-c"])
    replay = replay_origin(a, b, ["bn"], range(SAMPLES), label="bn")
    assert replay.outcome is ReplayOutcome.NOT_REPRODUCED and not replay.confirmed
    assert replay.sources == {"c": "run B only (run A does not observe it)"}
    assert replay.summary() == (
        "does not reproduce in isolation: fed identical inputs (c), bn computes bit-identical outputs under the two "
        "runs' options (A: --ep cpu --level all; B: --ep cpu --level disable) in 3 samples: the difference comes from "
        "fusion with nodes outside it or from its context in the full model")
    # under A's options bn alone gives what run B recorded, not what run A computed fused
    assert [side.recorded for side in replay.sides] == ["differs", "matches"]
    assert replay.sides[0].hashes == [_digest(y) for y in _raw(replay_runs["disable-c"], "y")]


def test_an_input_neither_run_observes_cannot_be_fed(replay_runs):
    """Both level-all runs fold bn into conv: c exists in neither dump."""
    replay = replay_origin(Run.open(replay_runs["nchwc-off"]), Run.open(_capture_all(replay_runs)), ["bn"], [0], "bn")
    assert replay.outcome is ReplayOutcome.CANNOT and replay.capture == []
    assert replay.summary() == (
        "cannot replay: c is observed in neither run's dump (computed inside a fused kernel, or held in a layout not "
        "established); replay a span that starts at tensors the runs observe")


def test_span_nodes_walk_up_to_the_observed_tensors(replay_runs):
    model = onnx.load(str(replay_runs["model"]))
    assert span_nodes(model, "y", {"r"}) == ["conv", "bn"]
    assert span_nodes(model, "y", {"r", "c"}) == ["bn"]
    assert span_nodes(model, "y", set()) == ["relu", "conv", "bn"]
    with pytest.raises(ConfigError, match=r"^replay: no node of the model computes 'input'$"):
        span_nodes(model, "input", set())


def test_a_run_without_a_dump_cannot_be_replayed(replay_runs, tmp_path):
    from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
    from qconsist.inputs import open_input_set

    plain = run_inference(resolve_model(replay_runs["model"]), open_input_set(replay_runs["inputs"], None, "input"),
                          RunRequest(ExecutionOptions()), tmp_path, run_id="plain").run_dir
    replay = replay_origin(Run.open(plain), Run.open(replay_runs["disable-c"]), ["bn"], [0], label="bn")
    assert replay.outcome is ReplayOutcome.CANNOT
    assert replay.reason == "run A has no tensor dump; rerun it with --dump"
    result = diff_runs(plain, replay_runs["disable-c"])
    assert confirm_origins(result) == [] and result.replays == []
    assert result.notes[-1] == "replay: the runs have no tensor comparison (both need --dump), so no origin to replay"


def test_a_session_config_entry_is_replayed_as_the_run_recorded_it(tmp_path):
    """Two runs of the QDQ conv built here at level all, one with session.disable_quant_qdq=1 (no QLinearConv
    fusion): the origin is confirmed in isolation under each run's recorded configuration entries."""
    from explain.qdq_models import qdq_conv_model, qdq_inputs
    from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inputs import open_input_set

    source = resolve_model(qdq_conv_model(tmp_path / "qdq.onnx"))
    inputs = open_input_set(qdq_inputs(tmp_path / "x.npy"), None, "x")
    runs = {}
    for key, entries in (("fused", {}), ("unfused", {"session.disable_quant_qdq": "1"})):
        request = RunRequest(ExecutionOptions(session_config=entries), dump=True, raw=RawSelection.parse("all"))
        runs[key] = run_inference(source, inputs, request, tmp_path / "runs", run_id=key).run_dir
    out = CliRunner().invoke(app, ["diff", "--replay", str(runs["fused"]), str(runs["unfused"])])
    assert out.exit_code == 1, out.output
    lines = out.output.splitlines()
    assert "options differ: session_config: None -> {'session.disable_quant_qdq': '1'}" in lines
    ya, yb = _raw(runs["fused"], "y"), _raw(runs["unfused"], "y")
    differing = [s for s in range(3) if not np.array_equal(ya[s], yb[s])]
    mismatched = sum(int((a != b).sum()) for a, b in zip(ya, yb))
    assert (differing, mismatched) == ([0, 1], 3)
    assert (
        "replay conv: confirmed in isolation: fed identical inputs (x_q), its 5 nodes (x_DequantizeLinear, "
        "w_DequantizeLinear, b_DequantizeLinear, ...) compute different outputs under the two runs' options (A: --ep cpu "
        "--level all; B: --ep cpu --level all --session-config session.disable_quant_qdq=1): 2/2 samples differ, "
        "mismatched elements 3 / 2304 (0.13%), greatest abs difference 1"
    ) in lines
    assert "  under B's options the replay matches what run B recorded" in lines
