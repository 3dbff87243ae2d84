"""The comparison across GPUs tells a node that depends on the GPU from one that varies from run to run (issue 31,
item 3): each GPU dumps the model twice, in fresh sessions, and ``qconsist.nightly.across`` classifies every node
that differs between the GPUs with those repeats.

No GPU here, and no CPU kernel that varies from run to run: the records are real dumps of a real model (built
below) made on the CPU EP, one fresh session each, standing in for the GPUs' dumps. A difference "on a GPU" is made
by altering one node's recorded output in a dump (every sample's hash of that tensor XOR-ed with one constant, the
manifest's sha256 of the table updated: ``alter_output``), so the dumps differ at that node exactly as two
devices' (or two sessions') would: its inputs observed and identical, its output not. A node that **depends on
the device** is altered alike in both of GPU 1's sessions; a node that **varies from run to run** in one session
of one GPU only.

On main one dump a GPU was compared, and every origin of the difference was reported as differing "between the
devices" (the FCN head's deconvolution3 under EXHAUSTIVE, blamed on GPU 1 on two H200s, varies on either GPU)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set
from qconsist.nightly.across import GpuComparison, compare_across_devices, compare_across_gpus
from qconsist.nightly.devices import host_gpus, visible_from
from qconsist.nightly.entry import EntryOutcome, RunRecord
from qconsist.report import render_nightly_report

SMI = """0, GPU-8d3c0f2a-1b2c-3d4e-5f60-718293a4b5c6, NVIDIA H100 80GB HBM3, 00000000:19:00.0
1, GPU-1f00aa11-2222-3333-4444-555566667777, NVIDIA H100 80GB HBM3, 00000000:3B:00.0
"""
DEVICES = visible_from("0,1", host_gpus(SMI))
G0, G1 = "GPU 0 (GPU-8d3c0f2a)", "GPU 1 (GPU-1f00aa11)"
HEAD = f"act: {G0} vs {G1} (CUDA EP dumps, EXHAUSTIVE/tf32=0; two fresh sessions on each)"


def activation_chain(path: Path) -> Path:
    """x [1, 4, 6, 6] -> Mul 'scale' -> LeakyRelu 'leaky' -> Add 'shift' -> Elu 'elu' -> HardSigmoid 'hard' -> y."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["scaled"], name="scale"),
             helper.make_node("LeakyRelu", ["scaled"], ["leaked"], name="leaky", alpha=0.1),
             helper.make_node("Add", ["leaked", "b"], ["shifted"], name="shift"),
             helper.make_node("Elu", ["shifted"], ["elued"], name="elu"),
             helper.make_node("HardSigmoid", ["elued"], ["y"], name="hard")]
    inits = [numpy_helper.from_array(np.array(1.5, np.float32), "s"), numpy_helper.from_array(np.array(-0.25, np.float32), "b")]
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


TABLE = "dump/table/hashes.npy"


def alter_output(run: Path, tensor: str) -> None:
    """Make ``tensor``'s recorded output differ in every sample (its hashes XOR-ed with one constant: which samples
    repeat the one before is kept, so the table's statistics still fit), and record the table's new sha256 in the
    manifest as the run would have."""
    index = json.loads((run / "dump" / "index.json").read_text())
    column = [t["name"] for t in index["tensors"]].index(tensor)
    hashes = np.load(run / TABLE)
    hashes[:, column] ^= np.uint64(0x9E3779B97F4A7C15)
    np.save(run / TABLE, hashes)
    blob = (run / TABLE).read_bytes()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["files"][TABLE] = {**manifest["files"][TABLE], "sha256": hashlib.sha256(blob).hexdigest(),
                                "md5": hashlib.md5(blob).hexdigest(), "size": len(blob)}
    (run / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, Path]:
    """Six real CPU-EP dumps of the model, one fresh session each: three as made (base, base2, base3), two with
    'leaky's output altered alike (device, device2: GPU 1 in both sessions), one with 'elu's (varies)."""
    folder = tmp_path_factory.mktemp("across")
    np.save(folder / "x.npy", np.random.default_rng(7).uniform(-3, 3, (3, 4, 6, 6)).astype(np.float32))
    inputs = open_input_set(str(folder / "x.npy"), None, "x")
    model = resolve_model(activation_chain(folder / "act.onnx"))
    made = {name: run_inference(model, inputs, RunRequest(ExecutionOptions(graph_optimization_level="disable"), dump=True),
                                folder / "runs", run_id=name).run_dir
            for name in ("base", "base2", "base3", "device", "device2", "varies")}
    for name, tensor in (("device", "leaked"), ("device2", "leaked"), ("varies", "elued")):
        alter_output(made[name], tensor)
    return made


def _entry(dumps: dict[str, Path], gpu0: tuple[str, str | None], gpu1: tuple[str, str | None]) -> EntryOutcome:
    """An entry dumped on two devices: ``(first session, second session)`` of each (None: no second dump)."""
    runs = []
    for roles, sessions in ((("gpu", "gpu-repeat"), gpu0), (("gpu:1", "gpu:1-repeat"), gpu1)):
        for role, name in zip(roles, sessions):
            if name is not None:
                runs.append(RunRecord(role, dumps[name].name, "inference", str(dumps[name])))
    return EntryOutcome(model="act", status="pass", runs=runs, devices=DEVICES)


def _compare(dumps, gpu0, gpu1) -> GpuComparison:
    (comparison,) = compare_across_devices([_entry(dumps, gpu0, gpu1)], {"act": "EXHAUSTIVE/tf32=0"})
    assert GpuComparison.from_json(json.loads(json.dumps(comparison.to_json()))) == comparison
    return comparison


def test_bit_identical_on_both_devices_and_in_both_sessions(dumps):
    c = _compare(dumps, ("base", "base2"), ("base3", "base"))
    assert str(c) == f"{HEAD}: bit-identical, each device's two sessions too; the two devices compute the same bits"
    assert (c.identical, c.nodes, c.run_to_run, c.device_origins, c.unknown, c.blame) == (True, (), (), (), None, "none")
    assert [(r.where, r.stable) for r in c.repeats] == [(G0, True), (G1, True)]


def test_a_node_that_depends_on_the_device_is_blamed_on_it(dumps):
    """'leaky' computes other bits on GPU 1 in both its sessions, from the same inputs as on GPU 0."""
    c = _compare(dumps, ("base", "base2"), ("device", "device2"))
    assert str(c) == (f"{HEAD}: 1 node(s) differ between the devices, first leaky; depends on the device: origins: leaky "
                      "(inputs identical on both, output stable in both sessions on each)")
    assert c.nodes == ("leaky",) and c.origins == ("leaky",)
    assert (c.device_origins, c.device_spans, c.run_to_run, c.blame) == (("leaky",), (), (), "device")


def test_a_node_that_varies_from_run_to_run_is_not_blamed_on_the_device(dumps):
    """'elu' differs between GPU 0's two sessions: the difference between the devices at 'elu' (an origin of it,
    which main reported as differing between the devices) is run-to-run variation, not the device."""
    c = _compare(dumps, ("varies", "base"), ("base2", "base3"))
    assert str(c) == (f"{HEAD}: 1 node(s) differ between the devices, first elu; no node shown to depend on the device; "
                      f"1 vary from run to run (on {G0} (origins: elu)), not blamed on the device")
    assert c.nodes == ("elu",) and c.origins == ("elu",)
    assert (c.device_origins, c.device_spans, c.run_to_run, c.blame) == ((), (), ("elu",), "run-to-run")
    gpu0, gpu1 = c.repeats
    assert (gpu0.nodes, gpu0.origins, gpu1.nodes) == (("elu",), ("elu",), ())


def test_both_a_device_dependent_node_and_a_varying_one(dumps):
    c = _compare(dumps, ("varies", "base"), ("device", "device2"))
    assert str(c) == (f"{HEAD}: 2 node(s) differ between the devices, first leaky; depends on the device: origins: leaky "
                      "(inputs identical on both, output stable in both sessions on each); 1 vary from run to run "
                      f"(on {G0} (origins: elu)), not blamed on the device")
    assert c.nodes == ("leaky", "elu") and c.origins == ("leaky", "elu")
    assert (c.device_origins, c.run_to_run, c.blame) == (("leaky",), ("elu",), "device and run-to-run")


def test_dumps_that_agree_by_chance_while_a_node_varies(dumps):
    """The first sessions agree, but GPU 1's second session differs at 'elu': the devices did not compute the
    same bits by construction, they agreed by chance."""
    c = _compare(dumps, ("base", "base2"), ("base3", "varies"))
    assert str(c) == (f"{HEAD}: bit-identical in these dumps, but 1 node(s) vary from run to run "
                      f"(on {G1} (origins: elu)): the two agreed by chance")
    assert (c.identical, c.run_to_run, c.blame) == (True, ("elu",), "run-to-run")


def test_without_a_second_dump_the_cause_is_unknown(dumps):
    c = _compare(dumps, ("varies", "base"), ("base2", None))
    assert str(c) == (f"act: {G0} vs {G1} (CUDA EP dumps, EXHAUSTIVE/tf32=0): 1 node(s) differ between the devices, first elu "
                      "(origins: elu); whether from the device "
                      f"or from run-to-run variation is unknown ({G1}: no second dump among the entry's runs)")
    assert (c.device_origins, c.run_to_run, c.blame) == ((), (), "unknown")
    assert c.unknown == f"{G1}: no second dump among the entry's runs"


def test_across_gpu_types_a_varying_node_is_not_blamed_on_the_type(dumps):
    """The same rule across GPU types (--across-gpus): each type's run dumps twice (gpu, gpu-repeat)."""
    def typed(gpu_type, first, second):
        runs = [RunRecord(role, dumps[name].name, "inference", str(dumps[name]))
                for role, name in (("gpu", first), ("gpu-repeat", second))]
        return EntryOutcome(model=f"act@{gpu_type}", status="pass", runs=runs, gpu_type=gpu_type)

    (c,) = compare_across_gpus([typed("H100", "base", "base2"), typed("H200", "varies", "base3")])
    assert str(c) == ("act: H100 vs H200 (CUDA EP dumps; two fresh sessions on each): 1 node(s) differ between the GPU types, "
                      "first elu; no node shown to depend on the GPU type; 1 vary from run to run (on H200 (origins: elu)), "
                      "not blamed on the GPU type")
    assert (c.scope, c.origins, c.device_origins, c.run_to_run) == ("type", ("elu",), (), ("elu",))
    (d,) = compare_across_gpus([typed("H100", "base", "base2"), typed("H200", "device", "device2")])
    assert (d.device_origins, d.run_to_run, d.blame) == (("leaky",), (), "device")
    assert "depends on the GPU type: origins: leaky" in str(d)


def test_classify_is_a_function_of_the_records():
    """The rule on records alone: a varying node is never blamed; a span is blamed only if nothing in it varied."""
    from qconsist.nightly.across import RepeatCheck, classify
    from qconsist.nightly.entry import gpu_role, repeat_role

    assert [repeat_role(gpu_role(i)) for i in (0, 1)] + [repeat_role("quantized")] == ["gpu-repeat", "gpu:1-repeat", "repeat"]
    stable = RepeatCheck("GPU 0"), RepeatCheck("GPU 1")
    assert classify(("a", "b"), ("a",), (), (), stable).device_origins == ("a",)
    varying = RepeatCheck("GPU 0", nodes=("b", "c"), origins=("b",)), RepeatCheck("GPU 1")
    blame = classify(("a", "b", "c", "d"), ("a", "b"), ("d",), (("x", "c"),), varying)
    assert (blame.device_origins, blame.device_spans, blame.run_to_run) == (("a",), (), ("b", "c"))
    inside = RepeatCheck("GPU 0", spans=("s",), span_nodes=(("k",),)), RepeatCheck("GPU 1")
    assert inside[0].varying == ("s", "k") and classify(("k",), ("k",), (), (), inside).device_origins == ()
    missing = classify(("a",), ("a",), (), (), (RepeatCheck("GPU 0"), RepeatCheck("GPU 1", error="no second dump")))
    assert (missing.device_origins, missing.unknown) == ((), "GPU 1: no second dump")
    assert classify(("a",), ("a",), (), (), ()).unknown == "no GPU was dumped twice"


def test_an_old_night_summary_reads_as_it_was_and_the_page_shows_the_classes(dumps):
    """A comparison recorded before the second dumps (no repeats) reads back with its own wording; the night page
    shows both."""
    old = {"model": "fcn_head", "gpu_a": G0, "gpu_b": G1, "role": "gpu", "run_a": "a", "run_b": "b", "identical": False,
           "nodes": ["deconvolution3", "upscore"], "origins": ["deconvolution3"], "error": None, "notes": [],
           "scope": "device", "spans": [], "span_nodes": [], "config": "EXHAUSTIVE/tf32=0", "devices": [], "first": "deconvolution3"}
    read = GpuComparison.from_json(old)
    assert read.blame == "unknown" and str(read) == (
        f"fcn_head: {G0} vs {G1} (CUDA EP dumps, EXHAUSTIVE/tf32=0): 2 node(s) differ between the devices, first "
        "deconvolution3 (origins: deconvolution3); one dump on each, so a node that varies from run to run on one GPU "
        "differs here too (locate tells them apart)")
    new = _compare(dumps, ("varies", "base"), ("device", "device2"))
    data = {"night_id": "night", "config": "nightly.toml", "entries": [], "summary": {}, "passed": True,
            "across_gpus": [old, new.to_json()], "seconds": 1.0}
    html = render_nightly_report(data)
    assert "<td class=\"status-fail\">2 node(s) differ, first deconvolution3</td>" in html
    assert ("2 node(s) differ, first leaky; depend on the GPU: leaky; vary from run to run: elu</td>") in html
    assert new.to_json()["blame"] == "device and run-to-run"
