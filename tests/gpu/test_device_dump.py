"""On-device dumps (CUDA EP, fingerprints computed on the GPU) against host fingerprints of the same tensors,
and a batch-32 dump diffed against a batch-1 dump. Run on the GPU machine: ``pytest -m gpu tests/gpu``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_builders import conv_transpose_model
from qconsist.diff import diff_runs
from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
from qconsist.inference.fingerprint import fingerprint
from qconsist.inference.reader import load_dump
from qconsist.store.run import Run
from qconsist.inference.runner import PRODUCTION_REPEATS
from qconsist.inputs import open_input_set

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def _deconv(tmp_path, batch):
    # a ConvTranspose with overlapping windows: cuDNN's HEURISTIC choice gives other last bits run after run
    # (../shared/MEASURED.md); a Relu after it keeps one exposed tensor downstream
    model = conv_transpose_model(64, 32, (56, 56), batch=batch, seed=4)
    model.graph.node[0].output[0] = "up"
    model.graph.node.append(onnx.helper.make_node("Relu", ["up"], ["y"], name="relu"))
    path = tmp_path / "deconv.onnx"
    onnx.save(model, str(path))
    return path


def _inputs(tmp_path, count):
    rng = np.random.default_rng(9)
    np.save(tmp_path / "x.npy", rng.standard_normal((count, 64, 56, 56)).astype(np.float32))
    return open_input_set(tmp_path / "x.npy", None, "x")


def _dump(model, inputs, tmp_path, run_id, search, batch=1, fingerprints="device", raw="all"):
    options = ExecutionOptions("cuda", {"cudnn_conv_algo_search": search, "use_tf32": False})
    request = RunRequest(options, dump=True, raw=RawSelection.parse(raw), batch_size=batch, fingerprints=fingerprints)
    return run_inference(resolve_model(model), inputs, request, tmp_path / "runs", run_id=run_id)


def _table(result):
    return load_dump(Run.open(result.run_dir)).table


def _differs(a, b):
    ta, tb = _table(a), _table(b)
    return ta.block(0, ta.samples)["hash"] != tb.block(0, tb.samples)["hash"]


def test_device_and_host_fingerprints_agree_on_what_is_equal_and_what_differs(tmp_path):
    model, inputs = _deconv(tmp_path, 1), _inputs(tmp_path, 4)
    a = _dump(model, inputs, tmp_path, "a", "HEURISTIC")
    b = _dump(model, inputs, tmp_path, "b", "HEURISTIC")
    for run in (a, b):
        # production itself gives other outputs run after run (the deconvolution): no dump can match it bit
        # for bit, and the runner says so instead of blaming the dump
        assert run.dump.fingerprints_on == "device" and not run.dump.faithful
        assert run.dump.production_distinct == PRODUCTION_REPEATS
        dump = load_dump(Run.open(run.run_dir))
        table = dump.table
        assert table.hash_functions() == {"qc-mix64/1"}
        for sample in range(table.shape[0]):
            for column in range(table.shape[1]):
                host = fingerprint(dump.raw(sample, column), 0)  # the host kernels on the raw tensor the GPU hashed
                record = table.record(sample, column)
                assert int(record["hash"]) == host[0]
                assert (record["min"], record["max"], int(record["nan"]), int(record["inf"])) == (host[1], host[2], host[4], host[5])
                assert record["mean"] == pytest.approx(host[3], rel=1e-9, abs=1e-12)
    # the same pair of runs, fingerprinted on the host from copies: the same verdict, tensor by tensor
    host_a = _dump(model, inputs, tmp_path, "ha", "HEURISTIC", fingerprints="host", raw="none")
    host_b = _dump(model, inputs, tmp_path, "hb", "HEURISTIC", fingerprints="host", raw="none")
    device_differs, host_differs = _differs(a, b), _differs(host_a, host_b)
    assert device_differs.any() and host_differs.any()  # the deconvolution is not run-to-run stable
    assert (device_differs.all(axis=0) == host_differs.all(axis=0)).all()
    result = diff_runs(a.run_dir, b.run_dir)
    assert [n.label for n in result.tensors.origins] == ["up"]
    # device and host hashes are one function: a device dump compares with a host dump of the same run kind
    stable_device = _dump(model, inputs, tmp_path, "sd", "DEFAULT")
    stable_host = _dump(model, inputs, tmp_path, "sh", "DEFAULT", fingerprints="host", raw="none")
    assert not _differs(stable_device, stable_host).any()
    assert diff_runs(stable_device.run_dir, stable_host.run_dir).tensors.nodes == []


def test_batch_32_against_batch_1_names_the_batch_dependent_nodes(tmp_path):
    model, inputs = _deconv(tmp_path, None), _inputs(tmp_path, 64)
    one = _dump(model, inputs, tmp_path, "b1", "DEFAULT", batch=1)
    again = _dump(model, inputs, tmp_path, "b1again", "DEFAULT", batch=1)
    many = _dump(model, inputs, tmp_path, "b32", "DEFAULT", batch=32)
    assert one.dump.faithful and many.dump.faithful
    assert diff_runs(one.run_dir, again.run_dir).tensors.nodes == []  # DEFAULT is stable run to run
    named = {n.label for n in diff_runs(one.run_dir, many.run_dir).tensors.nodes}
    # evidence: the raw tensors of each sample, batch 1 vs its row of batch 32, byte for byte
    d1, d32 = load_dump(Run.open(one.run_dir)), load_dump(Run.open(many.run_dir))
    differ = {d1.tensors[c].label for c in range(len(d1.tensors)) for s in range(64)
              if d1.raw(s, c).tobytes() != d32.raw(s, c).tobytes()}
    assert named == differ
    print(f"batch 32 vs batch 1, cuDNN DEFAULT: nodes whose outputs depend on the batch: {sorted(named) or 'none'}")


def test_open_nsfw_qdq_restamped_runs_at_batch_32_on_the_cuda_ep(nsfw_run, tmp_path):
    """``--dynamic-batch`` on the CUDA EP: whether the graph computes per sample is checked on the CPU EP (on the
    H100, open_nsfw QDQ at batch 2 and batch 1 are one quantization step apart in ``prob``: the kernels depend
    on the batch), so the re-stamped model runs; a batch-1 run of the same photos names what the batch changes."""
    from qconsist.inference.session import input_specs
    from qconsist.pipeline.config import load_pipeline

    config = load_pipeline(REPO / "pipelines" / "open_nsfw.toml")
    model = resolve_model(nsfw_run.path, "quantize")
    name = input_specs(model.path)[0].name
    options = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False})
    runs = {}
    for batch in (1, 32):
        inputs = open_input_set("package:photos", config.preprocess, name)
        request = RunRequest(options, batch_size=batch, dynamic_batch=batch > 1)
        runs[batch] = run_inference(model, inputs, request, tmp_path / "runs", run_id=f"b{batch}").run_dir
    restamped = Run.open(runs[32]).manifest.model["dynamic_batch"]
    assert restamped["path"] == "model/model.onnx"
    outputs = diff_runs(runs[1], runs[32]).outputs
    assert outputs.samples == 21 and outputs.greatest_abs <= 0.02  # a few quantization steps at most


def test_one_fused_launch_gives_the_two_kernels_records_bit_for_bit(nsfw_models, photo_samples, tmp_path):
    """``fingerprint_arena`` (one launch per step, the segment reduced by the block that finishes it) against
    ``chunk_stats`` + ``segment_reduce`` on the same arena of open_nsfw QDQ at batch 4 (the counters reset, so a
    second step agrees too); and the records that come back a step late (``submit``) equal ``run``'s, with the
    final output copied back through pinned memory."""
    import cupy as cp

    from qconsist.inference import device
    from qconsist.inference.dump import plan_dump
    from qconsist.store.arrays import ShapeTable

    model = nsfw_models["qdq"]
    options = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "HEURISTIC"})
    plan = plan_dump(model, options, tmp_path / "plan")
    names = [t.name for t in plan.tensors]
    dd = device.DeviceDump(plan.session, names, plan.dtypes, [True] * len(names), ShapeTable())
    records, _ = dd.run(photo_samples[1], 1)  # the two kernels then read the same arena
    layout, t = dd._layouts[1], dd._layouts[1].tables
    n = int(t["seg_bytes"].size)
    device._module["chunk_stats"]((layout.chunks,), (device.THREADS,), (
        layout.buffer, t["seg_offset"], t["seg_bytes"], t["seg_kind"], t["chunk_segment"], t["chunk_word"],
        np.int32(device.CHUNK_WORDS), t["p_hash"], t["p_lo"], t["p_hi"], t["p_sum"], t["p_nan"], t["p_inf"]))
    out = cp.empty((6, n), cp.uint64)
    device._module["segment_reduce"](((n + 127) // 128,), (128,), (
        np.int32(n), t["seg_bytes"], t["seg_kind"], t["first_chunk"], t["p_hash"], t["p_lo"], t["p_hi"], t["p_sum"],
        t["p_nan"], t["p_inf"], out[0], out[1].view(cp.float64), out[2].view(cp.float64), out[3].view(cp.float64),
        out[4], out[5]))
    two = dd._records(layout, out.get(), 1)
    assert records.tobytes() == two.tobytes()
    assert int(t["seg_done"].sum()) == 0
    again, _ = dd.run(photo_samples[1], 1)
    assert again.tobytes() == records.tobytes()
    late = [dd.submit(s, 1, [names.index(o) for o in plan.outputs]) for s in photo_samples]
    late.append(dd.collect())
    assert late[0] is None
    for sample, found in zip(photo_samples, late[1:]):
        expected, _ = dd.run(sample, 1)
        assert found[0].tobytes() == expected.tobytes()
        assert np.array_equal(found[1][names.index(plan.outputs[0])], plan.session.run([plan.outputs[0]], sample)[0])


def test_open_nsfw_qdq_dumped_at_batch_8_on_the_device_keeps_every_tensor_beside_production(nsfw_run, tmp_path):
    """On an H200 the dump of open_nsfw QDQ at --batch-size 32 on the CUDA EP left 231 of its 416 tensors out (a
    step of two ran other convolution algorithms than a step of one, its int8 tensors quanta off): the probe's
    step of the two samples in the other order establishes their batch axis. The dump keeps every tensor a
    batch-1 dump records, is faithful, and ran beside production."""
    import json

    from qconsist.inference.session import input_specs
    from qconsist.pipeline.config import load_pipeline

    config = load_pipeline(REPO / "pipelines" / "open_nsfw.toml")
    model = resolve_model(nsfw_run.path, "quantize")
    name = input_specs(model.path)[0].name
    options = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False})
    runs = {}
    for batch in (1, 8):
        inputs = open_input_set("package:photos", config.preprocess, name)
        request = RunRequest(options, dump=True, batch_size=batch, dynamic_batch=batch > 1, fingerprints="device")
        runs[batch] = run_inference(model, inputs, request, tmp_path / "runs", run_id=f"b{batch}")
    index = json.loads((runs[8].run_dir / "dump" / "index.json").read_text())
    assert index["left_out"] == {}
    assert runs[8].dump.tensors == runs[1].dump.tensors and runs[8].dump.faithful and runs[1].dump.faithful
    assert runs[8].dump.beside_production and runs[8].dump.samples_checked == 21
    result = diff_runs(runs[1].run_dir, runs[8].run_dir)
    assert result.tensors.compared == runs[1].dump.tensors and result.tensors.samples == 21
    print(f"open_nsfw QDQ, batch 8 against batch 1 on the device: {len(result.tensors.nodes)} node(s) differ")


def test_a_device_dump_of_a_branched_model_keeps_each_if_opaque_and_a_host_one_observes_inside(tmp_path):
    """The gated model (``branch_models.gated_model``: samples take both branches of ``gate``): fingerprinted on
    the GPU, the If's branches are left out with the reason (``branches.NOT_ON_DEVICE``: the device recorder binds
    fixed shapes, a branch's tensors are empty where it did not run); fingerprinted on the host, on the same EP,
    they are recorded; both dumps are faithful and record the same values for every tensor they share."""
    import json

    from branch_models import GATED_BRANCH_TENSORS, gated_inputs, gated_model
    from qconsist.inference.branches import NOT_ON_DEVICE

    BRANCHES = [name for name, _, _ in GATED_BRANCH_TENSORS]

    model = gated_model(tmp_path / "gated.onnx")
    inputs = open_input_set(str(gated_inputs(tmp_path / "x.npy")), None, "x")
    device = _dump(model, inputs, tmp_path, "device", "HEURISTIC", fingerprints="device", raw="none")
    host = _dump(model, inputs, tmp_path, "host", "HEURISTIC", fingerprints="host", raw="none")
    index = {name: json.loads((r.run_dir / "dump" / "index.json").read_text()) for name, r in (("device", device), ("host", host))}
    assert index["device"]["left_out"] == {"gate/branches": NOT_ON_DEVICE}
    assert [t["name"] for t in index["host"]["tensors"] if t["how"] == "branch"] == BRANCHES
    for result in (device, host):
        manifest = json.loads((result.run_dir / "manifest.json").read_text())
        assert manifest["sections"]["dump"]["faithful"] is True
    compared = diff_runs(device.run_dir, host.run_dir).tensors
    assert compared.nodes == []
    assert compared.branches_unobserved == (
        f"tensors inside If branches (A 0, B {len(BRANCHES)}): run A's dump was fingerprinted on the GPU, which keeps "
        "each If one node (dump it with --fingerprints host to compare inside)")
