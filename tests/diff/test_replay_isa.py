"""``qconsist diff --replay`` of runs made on different instruction sets: each run's origin replayed on the one it
recorded (a run of ``run --isa haswell`` again under QEMU emulating Haswell), both runs' options also under each,
and ``--isa MODEL`` to replay both on one.

Real emulation (``qemu-x86_64``, ``make qemu``) on ``isa_models.saturating_qlinear_model``: a QLinearConv whose
u8·s8 sums saturate on AVX2 without VNNI, dumped at level ``disable`` so that the origin is ``conv`` itself. What
the native side computes depends on this machine's processor (``qconsist.cpu.instruction_set()``): where its sums
are exact (VNNI, AMX, SSE) the emulated Haswell differs, where it saturates too they agree. Every figure is checked
against numpy on the raw tensors the runs kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from isa_models import saturating_inputs, saturating_qlinear_model
from qconsist.cli import app
from qconsist.cpu import instruction_set
from qconsist.diff import DiffResult, diff_runs
from qconsist.diff.replay import ReplayOutcome, replay_nodes
from qconsist.explain.confirm import confirm_origins
from qconsist.inference.session import ExecutionOptions
from qconsist.store.run import Run
from qconsist.store.serde import encode, loads

NATIVE = instruction_set()
DIFFERS = not NATIVE.saturates  # the native u8·s8 sums are exact, so an emulated Haswell computes other integers
SAMPLES = 2
NO_QEMU = ("error: --isa runs the model under QEMU user mode, and qemu-x86_64 is not installed: install the "
           "qemu-user package (apt-get install qemu-user; `make qemu` does it)")


@pytest.fixture(scope="module")
def isa_runs(tmp_path_factory) -> dict[str, Path]:
    """The QLinearConv model dumped at level disable with every tensor kept raw, natively and under Haswell."""
    folder = tmp_path_factory.mktemp("replay-isa")
    model, inputs = saturating_qlinear_model(folder / "qlinear.onnx"), saturating_inputs(folder / "x.npy", SAMPLES)
    runs = folder / "runs"
    common = [str(model), "--inputs", str(inputs), "--threads", "1", "--level", "disable", "--dump", "--raw", "all",
              "--runs-dir", str(runs)]
    for run_id, extra in (("native", []), ("haswell", ["--isa", "haswell"])):
        out = CliRunner().invoke(app, ["run", *common, "--run-id", run_id, *extra])
        assert out.exit_code == 0, out.output
    return {"model": model, "inputs": inputs, "native": runs / "native", "haswell": runs / "haswell"}


def _raw(run_dir: Path, tensor: str) -> list[np.ndarray]:
    """A tensor's raw arrays, sample by sample, read with numpy from the run's dump files alone."""
    index = json.loads((run_dir / "dump" / "index.json").read_text())
    column = next(i for i, t in enumerate(index["tensors"]) if t["original"] == tensor)
    return [np.load(run_dir / "dump" / "raw" / f"{s:06d}.npz")[f"t{column}"] for s in range(SAMPLES)]


def _figures(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[int, int, int, float]:
    """Differing samples, mismatched elements, elements, greatest abs difference (float64)."""
    differing = sum(not np.array_equal(x, y) for x, y in zip(a, b))
    mismatched = sum(int((x != y).sum()) for x, y in zip(a, b))
    greatest = max(float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max()) for x, y in zip(a, b))
    return differing, mismatched, sum(x.size for x in a), greatest


def _replay_lines(output: str) -> list[str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("replay conv: "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    return lines[start:end]


@pytest.mark.slow
def test_each_run_is_replayed_on_its_own_instruction_set_and_the_cause_named(isa_runs):
    out = CliRunner().invoke(app, ["diff", "--replay", str(isa_runs["native"]), str(isa_runs["haswell"])])
    assert out.exit_code == (1 if DIFFERS else 0), out.output
    settings = "A: --ep cpu --level disable --threads 1 on native; B: --ep cpu --level disable --threads 1 on emulated Haswell"
    if not DIFFERS:
        assert "replay conv" not in out.output  # nothing diverged: no origin to replay
        return
    y_native, y_haswell = _raw(isa_runs["native"], "y_q"), _raw(isa_runs["haswell"], "y_q")
    differing, mismatched, elements, greatest = _figures(y_native, y_haswell)
    assert (differing, mismatched, elements, greatest) == (2, 576, 576, 53.0)  # y_q quanta: 13.5 exact vs 0.25 saturated
    assert float(np.load(isa_runs["native"] / "outputs" / "o0.npy")[0, 0, 0, 0, 0]) == 13.5
    assert float(np.load(isa_runs["haswell"] / "outputs" / "o0.npy")[0, 0, 0, 0, 0]) == 0.25
    assert _replay_lines(out.output) == [
        f"replay conv: confirmed in isolation: fed identical inputs (x_q), conv computes different outputs under the two "
        f"runs' options and instruction sets ({settings}): {differing}/{SAMPLES} samples differ, mismatched elements "
        f"{mismatched} / {elements} (100.00%), greatest abs difference {greatest:.6g}",
        "  input x_q: runs A and B (bit-identical)",
        "  instruction sets: replayed under native and Haswell: differs; under the same instruction set: equal (native: "
        "0/2 samples differ; Haswell: 0/2 samples differ): the instruction set makes the difference",
        "  under A's options on native the replay matches what run A recorded",
        "  under B's options on emulated Haswell the replay matches what run B recorded",
    ]
    data = loads(CliRunner().invoke(app, ["diff", "--replay", "--json", str(isa_runs["native"]),
                                               str(isa_runs["haswell"])]).output)
    (replay,) = data["replays"]
    assert [side["isa"] for side in replay["sides"]] == ["native", "Haswell"]
    assert [side["recorded"] for side in replay["sides"]] == ["matches", "matches"]
    assert replay["same_isa"] == [{"isa": "native", "samples": 2, "differing": [], "reason": ""},
                                  {"isa": "Haswell", "samples": 2, "differing": [], "reason": ""}]
    assert replay["differing"] == [0, 1] and replay["confirmed"] is True
    assert encode(DiffResult.from_json(data)) == encode(data)  # the replay's new keys read back


@pytest.mark.slow
def test_isa_replays_both_runs_on_one_instruction_set(isa_runs):
    native, haswell = isa_runs["native"], isa_runs["haswell"]
    for isa, label, where in (("haswell", "Haswell", "on emulated Haswell"), ("native", "native", "on native")):
        out = CliRunner().invoke(app, ["diff", "--replay", "--isa", isa, str(native), str(haswell)])
        assert out.exit_code == (1 if DIFFERS else 0), out.output
        if not DIFFERS:
            continue
        off = isa != "native"
        settings = (f"A: --ep cpu --level disable --threads 1{' ' + where if off else ''}; "
                    f"B: --ep cpu --level disable --threads 1{' ' + where if off else ''}")
        # the run made on the other instruction set is the one the replay does not give back
        other = "A" if isa == "haswell" else "B"
        assert _replay_lines(out.output) == [
            f"replay conv: does not reproduce in isolation: fed identical inputs (x_q), conv computes bit-identical "
            f"outputs under the two runs' {'options and instruction sets' if off else 'options'} ({settings}) in "
            "2 samples: the difference comes from fusion with nodes outside it or from its context in the full model",
            "  input x_q: runs A and B (bit-identical)",
            *[f"  under {run}'s options{' ' + where if off else ''} the replay "
              f"{'differs from' if run == other else 'matches'} what run {run} recorded" for run in "AB"],
            f"  note: the runs were made on different instruction sets (native, Haswell) and --isa replayed both on "
            f"{label}: this replay leaves the instruction set out (without --isa each run is replayed on its own)",
        ]


@pytest.mark.slow
def test_replay_nodes_runs_each_side_on_its_instruction_set(isa_runs):
    """The library call, on the recorded arrays: the native side gives back run native's y_q, Haswell's run haswell's."""
    x_q = _raw(isa_runs["native"], "x_q")
    options = ExecutionOptions(graph_optimization_level="disable", intra_op_threads=1)
    replay = replay_nodes(isa_runs["model"], ["conv"], {s: {"x_q": x_q[s]} for s in range(SAMPLES)}, [options, options],
                          isas=("native", "Haswell"),
                          recorded=[{s: {"y_q": y} for s, y in enumerate(_raw(isa_runs[run], "y_q"))}
                                    for run in ("native", "haswell")])
    assert [side.recorded for side in replay.sides] == ["matches", "matches"]
    assert replay.outcome is (ReplayOutcome.CONFIRMED if DIFFERS else ReplayOutcome.NOT_REPRODUCED)
    assert [(c.isa, c.differing) for c in replay.same_isa] == [("native", []), ("Haswell", [])]
    # both on native: one instruction set, nothing to compare across
    same = replay_nodes(isa_runs["model"], ["conv"], {0: {"x_q": x_q[0]}}, [options, options])
    assert same.same_isa == [] and same.outcome is ReplayOutcome.NOT_REPRODUCED
    assert [side.isa for side in same.sides] == ["native", "native"]


def test_isa_needs_replay_and_a_cpu_model_qemu_knows(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    out = CliRunner().invoke(app, ["diff", a, b, "--isa", "haswell"])
    assert out.exit_code == 2
    assert out.output.strip().splitlines()[-1] == (
        "error: --isa chooses the instruction set of --replay: give --replay too (diff itself compares what the runs "
        "recorded)")
    out = CliRunner().invoke(app, ["diff", a, b, "--replay", "--isa", "pentium9"])
    assert out.exit_code == 2
    line = out.output.strip().splitlines()[-1]
    assert line.startswith("error: --isa 'pentium9' is not a CPU model QEMU knows: use native or one of ")
    assert ", Haswell, " in line and ", Nehalem, " in line
    out = CliRunner().invoke(app, ["diff", a, b, "--replay", "--isa", "native,haswell"])
    assert out.exit_code == 2
    assert out.output.strip().splitlines()[-1] == "error: --isa takes one CPU model here, got native, Haswell"


@pytest.mark.slow
def test_without_qemu_isa_exits_3_and_a_run_made_under_qemu_cannot_be_replayed(isa_runs, tmp_path, monkeypatch):
    native, haswell = str(isa_runs["native"]), str(isa_runs["haswell"])
    monkeypatch.setenv("PATH", str(tmp_path))  # no qemu-x86_64 on it
    out = CliRunner().invoke(app, ["diff", "--replay", "--isa", "haswell", native, haswell])
    assert out.exit_code == 3
    assert out.output.strip().splitlines() == [NO_QEMU]
    if not DIFFERS:
        return
    # without --isa the diff is made; the emulated run's replay says what it lacks
    out = CliRunner().invoke(app, ["diff", "--replay", native, haswell])
    assert out.exit_code == 1, out.output
    assert _replay_lines(out.output) == [
        "replay conv: cannot replay: run B was made under emulated Haswell and is replayed on it under QEMU user mode, "
        "and qemu-x86_64 is not installed: install the qemu-user package (apt-get install qemu-user; `make qemu` does "
        "it), or replay both runs on this processor with --isa native"]
    # and --isa native needs no QEMU
    out = CliRunner().invoke(app, ["diff", "--replay", "--isa", "native", native, haswell])
    assert out.exit_code == 1 and "replay conv: does not reproduce in isolation" in out.output


@pytest.mark.slow
def test_a_native_run_of_another_processor_is_replayed_here_with_a_note(isa_runs, tmp_path):
    """A run recorded natively on another processor cannot be replayed on it: the replay says so."""
    result = diff_runs(isa_runs["native"], isa_runs["native"])
    assert confirm_origins(result) == []  # a run against itself: no origin
    run = Run.open(isa_runs["haswell"])
    from qconsist.explain.confirm import recorded_isa

    assert recorded_isa(run, "B") == ("Haswell", "")
    assert recorded_isa(Run.open(isa_runs["native"]), "A") == ("native", "")
    other = json.loads(json.dumps(run.manifest.environment["cpu_isa"]))
    other["emulated"] = None  # what a native run on a Haswell machine records
    run.manifest.environment["cpu_isa"] = other
    elsewhere = (NATIVE.kernels, NATIVE.float_kernels) != ("AVX2 without VNNI", "FMA3 (NCHWc 8)")
    assert recorded_isa(run, "B") == ("native", (
        "run B was made natively on another processor (AVX2 without VNNI, float FMA3 (NCHWc 8)) and is replayed on "
        f"this one ({NATIVE.kernels}, float {NATIVE.float_kernels}): --isa MODEL replays both runs on one instruction "
        "set") if elsewhere else "")
    del run.manifest.environment["cpu_isa"]  # a run recorded before the instruction set was
    assert recorded_isa(run, "B") == ("native", "run B does not record its instruction set: replayed on this processor")


# --- origins inside ORT's optimized graph: a QDQ model's fused QLinearConv, NCHWc convolutions ---------------------


@pytest.fixture(scope="module")
def fused_runs(tmp_path_factory) -> dict[str, Path]:
    """``saturating_qdq_model`` at onnxruntime's default level (its QDQ Conv fused into a QLinearConv that only the
    optimized graph has), every tensor kept raw, natively and under Haswell."""
    from isa_models import saturating_qdq_model

    folder = tmp_path_factory.mktemp("replay-fused")
    model, inputs = saturating_qdq_model(folder / "qdq.onnx"), saturating_inputs(folder / "x.npy", SAMPLES)
    common = [str(model), "--inputs", str(inputs), "--threads", "1", "--dump", "--raw", "all", "--runs-dir",
              str(folder / "runs")]
    for run_id, extra in (("native", []), ("haswell", ["--isa", "haswell"])):
        out = CliRunner().invoke(app, ["run", *common, "--run-id", run_id, *extra])
        assert out.exit_code == 0, out.output
    return {"native": folder / "runs" / "native", "haswell": folder / "runs" / "haswell"}


def _raw_named(run_dir: Path, name: str) -> list[np.ndarray]:
    """An optimized-graph tensor's raw arrays as onnxruntime held them (a relaid one transposed back)."""
    index = json.loads((run_dir / "dump" / "index.json").read_text())
    column, tensor = next((i, t) for i, t in enumerate(index["tensors"]) if t["name"] == name)
    arrays = [np.load(run_dir / "dump" / "raw" / f"{s:06d}.npz")[f"t{column}"] for s in range(SAMPLES)]
    return [np.transpose(a, tensor["layout"]) if tensor.get("layout") else a for a in arrays]


@pytest.mark.slow
def test_a_fused_qlinearconv_is_replayed_from_the_optimized_graph_on_each_instruction_set(fused_runs):
    out = CliRunner().invoke(app, ["diff", "--replay", str(fused_runs["native"]), str(fused_runs["haswell"])])
    assert out.exit_code == (1 if DIFFERS else 0), out.output
    if not DIFFERS:
        return
    lines = out.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("replay "))
    label = "conv_token_4 (com.microsoft:QLinearConv, internal to ORT's optimized graph)"
    # the fused node's output, as each run held it: what the replay gives back on each instruction set
    differing, mismatched, elements, greatest = _figures(_raw_named(fused_runs["native"], "conv_token_3"),
                                                         _raw_named(fused_runs["haswell"], "conv_token_3"))
    assert (differing, mismatched, elements, greatest) == (2, 576, 576, 53.0)
    settings = "A: --ep cpu --level disable --threads 1 on native; B: --ep cpu --level disable --threads 1 on emulated Haswell"
    assert lines[start:start + 6] == [
        f"replay {label}: confirmed in isolation: fed identical inputs (Transpose_out0), conv_token_4 computes "
        f"different outputs under the two runs' options and instruction sets ({settings}): 2/2 samples differ, "
        f"mismatched elements {mismatched} / {elements} (100.00%), greatest abs difference {greatest:.6g}",
        "  input Transpose_out0: runs A and B (bit-identical)",
        "  instruction sets: replayed under native and Haswell: differs; under the same instruction set: equal (native: "
        "0/2 samples differ; Haswell: 0/2 samples differ): the instruction set makes the difference",
        "  under A's options on native the replay matches what run A recorded",
        "  under B's options on emulated Haswell the replay matches what run B recorded",
        "  note: replayed from onnxruntime's optimized graph that each run's dump saved (the nodes the run executed), "
        "at level disable: the graph is optimized already",
    ]


@pytest.fixture(scope="module")
def nchwc_runs(tmp_path_factory) -> dict[str, Path]:
    """A float Relu -> Conv -> BatchNormalization that onnxruntime runs in NCHWc blocks (16 channels on AVX-512,
    8 on AVX2 and SSE) at level all, dumped natively and under Haswell and Nehalem (both blocks of 8)."""
    from isa_models import blocked_conv_model

    folder = tmp_path_factory.mktemp("replay-nchwc")
    model, inputs = blocked_conv_model(folder / "rcb.onnx"), folder / "x.npy"
    np.save(inputs, np.random.default_rng(3).normal(0, 1, (1, 16, 12, 12)).astype(np.float32))
    common = [str(model), "--inputs", str(inputs), "--threads", "1", "--dump", "--raw", "all", "--runs-dir",
              str(folder / "runs")]
    for run_id, extra in (("native", []), ("haswell", ["--isa", "haswell"]), ("nehalem", ["--isa", "nehalem"])):
        out = CliRunner().invoke(app, ["run", *common, "--run-id", run_id, *extra])
        assert out.exit_code == 0, out.output
    return {key: folder / "runs" / key for key in ("native", "haswell", "nehalem")}


@pytest.mark.slow
def test_nchwc_nodes_are_replayed_only_where_their_channel_block_is_the_graphs(nchwc_runs):
    label = "y_nchwc (com.microsoft.nchwc:Conv, internal to ORT's optimized graph)"
    haswell, nehalem = str(nchwc_runs["haswell"]), str(nchwc_runs["nehalem"])
    # FMA3 against SSE, one block of 8: each graph on its own processor, then both on each
    out = CliRunner().invoke(app, ["diff", "--replay", haswell, nehalem])
    assert out.exit_code == 1, out.output
    lines = [line for line in out.output.splitlines() if line.startswith(f"replay {label}") or
             line.startswith("  instruction sets: ")]
    assert lines[0].startswith(
        f"replay {label}: confirmed in isolation: fed identical inputs (r), its 2 nodes (ReorderInput, y_nchwc) compute "
        "different outputs under the two runs' options and instruction sets (A: --ep cpu --level disable --threads 1 on "
        "emulated Haswell; B: --ep cpu --level disable --threads 1 on emulated Nehalem): 1/1 samples differ")
    assert lines[1] == ("  instruction sets: replayed under Haswell and Nehalem: differs; under the same instruction "
                        "set: equal (Haswell: 0/1 samples differ; Nehalem: 0/1 samples differ): the instruction set "
                        "makes the difference")
    # a block of 8 does not run on a processor of 16
    block = int(NATIVE.float_kernels.split("NCHWc ")[1].rstrip(")"))
    if block != 8:
        out = CliRunner().invoke(app, ["diff", "--replay", "--isa", "native", haswell, nehalem])
        assert f"replay {label}: cannot replay: its NCHWc nodes (ReorderInput, y_nchwc) hold filters in channel blocks " \
               f"of 8, the runs' processors' width, and native's is {block}: replay without --isa, or with one of the " \
               "runs' instruction sets" in out.output.splitlines()


NATIVE_BLOCK = int(NATIVE.float_kernels.split("NCHWc ")[1].rstrip(")"))
BLOCKS_LABEL = "y_nchwc (com.microsoft.nchwc:Conv, internal to ORT's optimized graph)"


def _blocks_and_figures(nchwc_runs) -> tuple[list[int], tuple[int, int, int, float]]:
    """The two runs' recorded NCHWc blocks, and y_nchwc's figures between them from the raw arrays the dumps kept
    (in NCHW without padding channels, as each dump records a blocked tensor)."""
    runs = (nchwc_runs["native"], nchwc_runs["haswell"])
    blocks = [json.loads((run / "dump" / "index.json").read_text())["nchwc_block"] for run in runs]
    a, b = ([_raw_column(run, "reorder_token_1")] for run in runs)
    assert a[0].shape == b[0].shape == (1, 32, 12, 12)
    return blocks, _figures(a, b)


def _raw_column(run_dir: Path, name: str) -> np.ndarray:
    """The first sample's raw array of a tensor of the optimized graph, read with numpy from the dump's files."""
    index = json.loads((run_dir / "dump" / "index.json").read_text())
    column = next(i for i, t in enumerate(index["tensors"]) if t["name"] == name)
    with np.load(run_dir / "dump" / "raw" / "000000.npz") as raw:
        return raw[f"t{column}"]


@pytest.mark.slow
def test_nchwc_runs_of_two_blocks_are_replayed_each_on_its_own_graph_and_compared_in_nchw(nchwc_runs):
    """AVX-512 (blocks of 16) against Haswell (8): before, "cannot replay: ... blocks of 16 in run A and 8 in run B".
    Now each run's NCHWc Conv from its own optimized graph on its own instruction set, its blocked input fed in NCHW
    (blocked again by ReorderInput), its blocked output unblocked by ReorderOutput and compared in NCHW; under one
    instruction set both runs' options run that set's graph (the filters equal by value in OIHW)."""
    blocks, figures = _blocks_and_figures(nchwc_runs)
    assert blocks == [NATIVE_BLOCK, 8]
    out = CliRunner().invoke(app, ["diff", "--replay", str(nchwc_runs["native"]), str(nchwc_runs["haswell"])])
    assert out.exit_code == 1, out.output
    lines = out.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("replay "))
    if NATIVE_BLOCK == 8:  # one block: the graphs are replayed as onnxruntime holds them (the test above)
        assert lines[start].startswith(f"replay {BLOCKS_LABEL}: confirmed in isolation: fed identical inputs (r)")
        return
    differing, mismatched, elements, greatest = figures
    assert (differing, elements) == (1, 4608) and 0 < mismatched < elements and 0 < greatest < 1e-4
    settings = "A: --ep cpu --level disable --threads 1 on native; B: --ep cpu --level disable --threads 1 on emulated Haswell"
    assert lines[start:start + 8] == [
        f"replay {BLOCKS_LABEL}: confirmed in isolation: fed identical inputs (reorder_token_0), y_nchwc computes "
        f"different outputs under the two runs' options and instruction sets ({settings}): 1/1 samples differ, "
        f"mismatched elements {mismatched} / {elements} ({100 * mismatched / elements:.2f}%), greatest abs difference "
        f"{greatest:.6g}",
        "  input reorder_token_0: runs A and B (bit-identical)",
        "  instruction sets: replayed under native and Haswell: differs; under the same instruction set: equal (native: "
        "0/1 samples differ; Haswell: 0/1 samples differ): the instruction set makes the difference",
        "  under A's options on native the replay matches what run A recorded",
        "  under B's options on emulated Haswell the replay matches what run B recorded",
        f"  note: the runs' graphs hold NCHWc blocks of {NATIVE_BLOCK} (A) and 8 (B), each its processor's: each run's "
        "nodes were replayed from its own optimized graph on its own instruction set, fed and compared in NCHW without "
        "padding channels (reorder_token_0, reorder_token_1: blocked again by ReorderInput for the graph, unblocked by "
        "ReorderOutput, exact moves)",
        "  note: a graph runs only on a processor of its block, so under the same instruction set both runs' options ran "
        "that instruction set's graph (native: A's, Haswell: B's), which equals the other's by value (constants, "
        "filters compared in OIHW, and node attributes)",
        "  note: replayed from onnxruntime's optimized graph that each run's dump saved (the nodes the run executed), "
        "at level disable: the graph is optimized already",
    ]
    data = loads(CliRunner().invoke(app, ["diff", "--replay", "--json", str(nchwc_runs["native"]),
                                          str(nchwc_runs["haswell"])]).output)
    (replay,) = data["replays"]
    assert (replay["nodes"], replay["inputs"], replay["outputs"]) == (["y_nchwc"], ["reorder_token_0"], ["reorder_token_1"])
    assert [(side["isa"], side["recorded"]) for side in replay["sides"]] == [("native", "matches"), ("Haswell", "matches")]
    assert replay["constants_differ"] == [] and replay["confirmed"] is True
    assert (replay["mismatched"], replay["elements"], replay["max_abs"]) == (mismatched, elements, greatest)


@pytest.mark.slow
def test_isa_replays_runs_of_two_blocks_on_the_graph_of_its_own_block(nchwc_runs):
    """--isa with runs of two blocks: both runs' options run the graph of the run whose block is the instruction
    set's (the other run's graph does not run there); an instruction set of no recorded block cannot replay."""
    native, haswell = str(nchwc_runs["native"]), str(nchwc_runs["haswell"])
    if NATIVE_BLOCK == 8:
        return  # one block: test_nchwc_nodes_are_replayed_only_where_their_channel_block_is_the_graphs
    for isa, label, own, other in (("haswell", "Haswell", "B", "A"), ("native", "native", "A", "B")):
        out = CliRunner().invoke(app, ["diff", "--replay", "--isa", isa, native, haswell])
        assert out.exit_code == 1, out.output
        lines = out.output.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("replay "))
        where = f" on emulated {label}" if isa != "native" else ""
        block = 8 if isa != "native" else NATIVE_BLOCK
        assert lines[start].startswith(
            f"replay {BLOCKS_LABEL}: does not reproduce in isolation: fed identical inputs (reorder_token_0), y_nchwc "
            "computes bit-identical outputs")
        assert lines[start + 2:start + 5] == [
            *[f"  under {run}'s options{where} the replay {'matches' if run == own else 'differs from'} what run {run} "
              "recorded" for run in "AB"],
            f"  note: the runs' graphs hold NCHWc blocks of {NATIVE_BLOCK} (A) and 8 (B), and a graph runs only on a "
            f"processor of its block: on {label} (block {block}) both runs' options ran run {own}'s graph, which equals "
            f"run {other}'s by value (constants, filters compared in OIHW, and node attributes); blocked tensors fed and "
            "compared in NCHW",
        ]
    # Nehalem: no run recorded it; its block is measured in a child under QEMU (8: SSE), so B's graph runs there
    out = CliRunner().invoke(app, ["diff", "--replay", "--isa", "nehalem", native, haswell])
    assert out.exit_code == 1, out.output
    lines = out.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("replay "))
    assert lines[start + 2:start + 5] == [
        "  under A's options on emulated Nehalem the replay differs from what run A recorded",
        "  under B's options on emulated Nehalem the replay differs from what run B recorded",
        f"  note: the runs' graphs hold NCHWc blocks of {NATIVE_BLOCK} (A) and 8 (B), and a graph runs only on a "
        "processor of its block: on Nehalem (block 8) both runs' options ran run B's graph, which equals run A's by "
        "value (constants, filters compared in OIHW, and node attributes); blocked tensors fed and compared in NCHW",
    ]


@pytest.mark.slow
def test_a_graph_of_another_block_made_natively_elsewhere_is_not_replayed_here(nchwc_runs, tmp_path):
    """Run B made natively on an AVX2 machine (its graph in blocks of 8) is replayed on this processor only where
    this processor's block is 8; else the replay says why and what to do."""
    import shutil

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(nchwc_runs["haswell"], elsewhere)
    manifest = json.loads((elsewhere / "manifest.json").read_text())
    manifest["environment"]["cpu_isa"]["emulated"] = None  # what a native run on a Haswell machine records
    (elsewhere / "manifest.json").write_text(json.dumps(manifest))
    out = CliRunner().invoke(app, ["diff", "--replay", str(nchwc_runs["native"]), str(elsewhere)])
    assert out.exit_code == 1, out.output
    lines = out.output.splitlines()
    replay = next(line for line in lines if line.startswith("replay "))
    if NATIVE_BLOCK == 8:  # one block, and B is replayed on a processor of its block
        assert replay.startswith(f"replay {BLOCKS_LABEL}: ")
        assert "cannot replay" not in replay
        return
    assert replay == (
        f"replay {BLOCKS_LABEL}: cannot replay: its NCHWc nodes (y_nchwc) hold their tensors in channel blocks of "
        f"{NATIVE_BLOCK} in run A and 8 in run B, and run B's is replayed on this processor, whose block is "
        f"{NATIVE_BLOCK}: a graph runs only on a processor of its block; --isa MODEL replays both runs' options on an "
        "instruction set of one of their blocks (e.g. --isa haswell for 8)")


@pytest.mark.slow
def test_filters_of_two_blocks_are_compared_by_value(nchwc_runs):
    """The two runs' reordered filters differ in bytes (blocks of 16 and 8) and equal in OIHW; another weight is a
    difference by value (the same-instruction-set check then cannot run the other run's graph)."""
    import onnx
    from onnx import numpy_helper

    from qconsist.diff.replay import constants_differ, isolate
    from qconsist.explain.confirm import _differ_by_value

    graphs = [onnx.load(nchwc_runs[run] / "dump" / "optimized.onnx") for run in ("native", "haswell")]
    example = {"reorder_token_0": np.zeros((1, 16, 12, 12), np.float32)}
    bytewise = constants_differ(*(isolate(g, ["y_nchwc"], (), example) for g in graphs))
    assert bytewise == ([] if NATIVE_BLOCK == 8 else ["reorder"])
    assert _differ_by_value(graphs, ["y_nchwc"], ["reorder_token_1"], example, (NATIVE_BLOCK, 8)) == []
    changed = next(i for i in graphs[1].graph.initializer if i.name == "reorder")
    weights = numpy_helper.to_array(changed).copy()
    weights.flat[5] += 1
    changed.CopyFrom(numpy_helper.from_array(weights, "reorder"))
    assert _differ_by_value(graphs, ["y_nchwc"], ["reorder_token_1"], example, (NATIVE_BLOCK, 8)) == ["reorder"]


def test_blocked_tensors_are_fed_and_compared_in_nchw_through_reorders(tmp_path):
    """Natively (no QEMU): the NCHWc Conv alone, cut from the optimized graph the dump saved, fed its blocked input
    as the dump recorded it (NCHW, blocked again by a ReorderInput) and its blocked output unblocked by a
    ReorderOutput, gives back what the run recorded, bit for bit; unnamed nodes keep their names."""
    import onnx

    from isa_models import blocked_conv_model
    from qconsist.explain.confirm import _in_nchw
    from qconsist.inference.graphmap import node_names

    model, inputs = blocked_conv_model(tmp_path / "rcb.onnx"), tmp_path / "x.npy"
    np.save(inputs, np.random.default_rng(3).normal(0, 1, (2, 16, 12, 12)).astype(np.float32))
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(inputs), "--threads", "1", "--dump", "--raw",
                                   "all", "--runs-dir", str(tmp_path / "runs"), "--run-id", "native"])
    assert out.exit_code == 0, out.output
    run = tmp_path / "runs" / "native"
    graph = onnx.load(run / "dump" / "optimized.onnx")
    graph.graph.node[0].name = ""  # the Relu, unnamed: its invented name must survive the added nodes
    names = node_names(graph.graph)
    wrapped, added = _in_nchw(graph, ["y_nchwc"], ["reorder_token_0"], ["reorder_token_1"],
                              {"reorder_token_0": 16, "reorder_token_1": 32})
    assert added == (["replay.ReorderInput.reorder_token_0"], ["replay.ReorderOutput.reorder_token_1"])
    assert node_names(wrapped.graph)[1:1 + len(names)] == names
    index = json.loads((run / "dump" / "index.json").read_text())
    columns = {t["name"]: i for i, t in enumerate(index["tensors"])}
    fed, recorded = {}, {}
    for sample in range(2):
        with np.load(run / "dump" / "raw" / f"{sample:06d}.npz") as raw:
            fed[sample] = {"reorder_token_0": raw[f"t{columns['reorder_token_0']}"]}
            recorded[sample] = {"reorder_token_1": raw[f"t{columns['reorder_token_1']}"]}
    assert fed[0]["reorder_token_0"].shape == (1, 16, 12, 12) and recorded[0]["reorder_token_1"].shape == (1, 32, 12, 12)
    options = ExecutionOptions(graph_optimization_level="disable", intra_op_threads=1)
    replay = replay_nodes((wrapped, wrapped), [*added[0], "y_nchwc", *added[1]], fed, (options, options),
                          outputs=["reorder_token_1"], recorded=(recorded, recorded))
    assert [side.recorded for side in replay.sides] == ["matches", "matches"]
    assert replay.outcome is ReplayOutcome.NOT_REPRODUCED and replay.elements == 2 * 32 * 12 * 12
