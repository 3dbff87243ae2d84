"""Which GPU an entry ran on, and one model across the devices of one node (issue 31, item 3), on this machine
(no GPU): nvidia-smi's numbering joined with CUDA_VISIBLE_DEVICES as Ray sets it; the nightly file's
``devices``; what Ray is asked for; an entry that asks for more GPUs than it sees; and the comparison across
devices, keyed by device, naming origins and spans, on real dumps that differ (an int8 conv chain at the levels
all and disable: a fused QLinearConv, a span). The GPU runs themselves are tests/nightly/test_ray_gpus.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nightly_files import derived_nightly
from origin_models import qdq_conv_chain
from qconsist.cli import app
from qconsist.errors import ConfigError
from qconsist.history import History
from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set
from qconsist.nightly import load_nightly, night_tasks
from qconsist.nightly.across import GpuComparison, compare_across_devices, compare_across_gpus
from qconsist.nightly.devices import GpuDevice, host_gpus, visible_from
from qconsist.nightly.entry import EntryOutcome, RunRecord
from qconsist.nightly.executors.ray import needs
from qconsist.report import render_nightly_report

# nvidia-smi --query-gpu=index,uuid,name,pci.bus_id --format=csv,noheader on a machine of two H100s
SMI = """0, GPU-8d3c0f2a-1b2c-3d4e-5f60-718293a4b5c6, NVIDIA H100 80GB HBM3, 00000000:19:00.0
1, GPU-1f00aa11-2222-3333-4444-555566667777, NVIDIA H100 80GB HBM3, 00000000:3B:00.0
"""
HOST = host_gpus(SMI)
H100 = "NVIDIA H100 80GB HBM3"


def test_the_host_numbering_and_the_process_numbering_of_its_gpus():
    assert [(g.index, g.host_index, g.uuid[:12], g.bus_id) for g in HOST] == [
        (0, 0, "GPU-8d3c0f2a", "00000000:19:00.0"), (1, 1, "GPU-1f00aa11", "00000000:3B:00.0")]
    # Ray gives a task the host's GPU 1: the process sees one GPU, its device 0
    (seen,) = visible_from("1", HOST)
    assert (seen.index, seen.host_index, seen.uuid, seen.name) == (0, 1, HOST[1].uuid, H100)
    assert str(seen) == f"GPU 1 of the host ({H100}, {HOST[1].uuid}, device 0 in its process)"
    assert seen.short == "GPU 1 (GPU-1f00aa11)"
    # unset: every GPU, as the host numbers them; empty: none; UUID prefixes; CUDA stops at the first bad entry
    assert visible_from(None, HOST) == HOST and visible_from("", HOST) == []
    assert [(g.index, g.host_index) for g in visible_from("GPU-1f00,0", HOST)] == [(0, 1), (1, 0)]
    assert [(g.index, g.host_index) for g in visible_from("1,7,0", HOST)] == [(0, 1)]
    assert visible_from("GPU-", HOST) == []  # a prefix of both: ambiguous, CUDA refuses it
    assert [g.host_index for g in visible_from("1,1", HOST)] == [1]
    assert GpuDevice.from_json(seen.to_json()) == seen


@pytest.mark.parametrize(("value", "message"), [
    (1, "'devices' must be a number of GPUs from 2 to 64 or \"all\" (every GPU of the node), got 1"),
    (True, "'devices' must be a number of GPUs from 2 to 64 or \"all\" (every GPU of the node), got True"),
    ("each", "'devices' must be a number of GPUs from 2 to 64 or \"all\" (every GPU of the node), got 'each'"),
    (65, "'devices' must be a number of GPUs from 2 to 64 or \"all\" (every GPU of the node), got 65"),
])
def test_devices_in_a_nightly_file_is_a_count_or_all(tmp_path, value, message):
    path = derived_nightly(tmp_path, ["fcn_head"], extra={"fcn_head": {"devices": value}})
    with pytest.raises(ConfigError) as caught:
        load_nightly(path)
    assert caught.value.message == f"{path.resolve()}: model 'fcn_head': {message}"
    out = CliRunner().invoke(app, ["nightly", str(path)])
    assert out.exit_code == 2 and message in " ".join(out.output.split()), out.output


def test_what_ray_is_asked_for_an_entry_on_several_devices(tmp_path):
    path = derived_nightly(tmp_path, ["fcn_head", "fcn_head-determinized"], extra={
        "fcn_head": {"devices": 2}, "fcn_head-determinized": {"devices": "all", "gpus": ["H100"]}})
    config = load_nightly(path)
    assert [e.devices for e in config.models] == [2, "all"]
    pair, every = night_tasks(config, History(config.history), "night")
    cluster = {"CPU": 32.0, "GPU": 4.0, "accelerator_type:H100": 1.0, "memory": 2**36}
    base = {"num_cpus": 1.0, "max_retries": 0, "retry_exceptions": False}
    assert needs(pair, cluster, largest_node=2.0) == {**base, "num_gpus": 2}
    assert needs(every, cluster, largest_node=4.0) == {**base, "num_gpus": 4, "accelerator_type": "H100"}
    # two nodes of one GPU each: 2 GPUs in the cluster, but no node has two
    assert needs(pair, cluster, largest_node=1.0) == "needs 2 GPUs of one node (devices = 2); the largest node of the Ray cluster has 1"
    assert needs(every, {"CPU": 2.0, "accelerator_type:H100": 1.0, "GPU": 0.0}, largest_node=0.0) == (
        "needs a H100 GPU; the Ray cluster declares H100 nodes but no GPUs")
    assert needs(pair, {"CPU": 2.0}, largest_node=0.0) == (
        "needs 2 GPUs of one node (devices = 2); the largest node of the Ray cluster has 0")


def test_an_entry_asking_for_more_gpus_than_its_process_sees_cannot_be_judged(tmp_path):
    """Here no GPU: an entry with devices = 2 is an error at once (no pipeline run), not a pass without the
    comparison it asked for; the other entry runs."""
    path = derived_nightly(tmp_path, ["fcn_head", "fcn_head-determinized"], extra={"fcn_head": {"devices": 2}})
    out = CliRunner().invoke(app, ["nightly", str(path), "--json"])
    assert out.exit_code == 2, out.output
    data = json.loads(out.stdout)
    (asked, other) = data["entries"]
    assert (asked["status"], asked["error"], asked["entry_run"]) == (
        "error", "asks for 2 distinct GPUs (devices = 2); its process sees none", None)
    assert other["status"] == "pass" and other["devices"] == []
    assert data["across_gpus"] == [] and data["seconds"] > 0
    assert not list((tmp_path / "runs").glob("fcn_head-2*"))  # no pipeline run of the entry that asked for GPUs


@pytest.fixture(scope="module")
def chain_dumps(tmp_path_factory) -> dict[str, Path]:
    """Real dumps that differ: an int8 conv chain at levels all (a fused NHWC QLinearConv) and disable, each twice
    (two fresh sessions, as the nightly dumps each GPU: the level stands in for the device)."""
    folder = tmp_path_factory.mktemp("chain")
    model = qdq_conv_chain(folder / "chain.onnx")
    np.save(folder / "x.npy", np.random.default_rng(5).uniform(-12, 12, (3, 8, 12, 12)).astype(np.float32))
    inputs = open_input_set(str(folder / "x.npy"), None, "x")
    return {f"{level}{session}": run_inference(resolve_model(model), inputs, RunRequest(ExecutionOptions(graph_optimization_level=level),
                                                                          dump=True, raw=RawSelection.parse("all")),
                                 folder / "runs", run_id=f"{level}{session}").run_dir
            for level in ("all", "disable") for session in ("", "2")}


def _outcome(model: str, dumps: dict[str, Path], devices: list[GpuDevice], roles=("gpu", "gpu:1"), gpu_type=None) -> EntryOutcome:
    runs = [RunRecord(role, path.name, "inference", str(path)) for role, path in zip(roles, dumps.values())]
    return EntryOutcome(model=model, status="pass", runs=runs, devices=devices, gpu_type=gpu_type)


ROLES = ("gpu", "gpu-repeat", "gpu:1", "gpu:1-repeat")


def _pair(dumps: dict[str, Path], *names: str) -> dict[int, Path]:
    """The dumps ``names``, in this order (one may come twice: a run in two roles)."""
    return {i: dumps[name] for i, name in enumerate(names)}


def test_the_comparison_across_devices_names_the_devices_and_the_span(chain_dumps):
    """GPU 0 = level all, GPU 1 = level disable, each in two sessions: stable on each, different between them,
    with a span whose nodes are all stable: blamed on the device."""
    devices = visible_from("0,1", HOST)
    dumps = _pair(chain_dumps, "all", "all2", "disable", "disable2")
    (comparison,) = compare_across_devices([_outcome("chain", dumps, devices, roles=ROLES)], {"chain": "HEURISTIC/tf32=0"})
    assert (comparison.scope, comparison.gpu_a, comparison.gpu_b, comparison.role, comparison.config) == (
        "device", "GPU 0 (GPU-8d3c0f2a)", "GPU 1 (GPU-1f00aa11)", "gpu", "HEURISTIC/tf32=0")
    assert [d["uuid"] for d in comparison.devices] == [HOST[0].uuid, HOST[1].uuid]
    assert (comparison.run_a, comparison.run_b) == (str(chain_dumps["all"]), str(chain_dumps["disable"]))
    assert [(r.where, r.run_a, r.run_b, r.stable) for r in comparison.repeats] == [
        ("GPU 0 (GPU-8d3c0f2a)", str(chain_dumps["all"]), str(chain_dumps["all2"]), True),
        ("GPU 1 (GPU-1f00aa11)", str(chain_dumps["disable"]), str(chain_dumps["disable2"]), True)]
    assert not comparison.identical and comparison.nodes == ("conv0", "conv1", "c1_DequantizeLinear")
    assert comparison.origins == () and comparison.spans == ("conv0",)
    assert comparison.span_nodes == (("x_DequantizeLinear", "w0_DequantizeLinear", "b0_DequantizeLinear", "conv0", "c0_QuantizeLinear"),)
    assert (comparison.device_origins, comparison.device_spans, comparison.run_to_run) == ((), ("conv0",), ())
    assert str(comparison) == (
        "chain: GPU 0 (GPU-8d3c0f2a) vs GPU 1 (GPU-1f00aa11) (CUDA EP dumps, HEURISTIC/tf32=0; two fresh sessions on each): "
        "3 node(s) differ between the devices, first conv0; depends on the device: spans: conv0 (nodes inside: "
        "x_DequantizeLinear, w0_DequantizeLinear, b0_DequantizeLinear, conv0, c0_QuantizeLinear) (inputs identical on both, "
        "output stable in both sessions on each)")
    assert GpuComparison.from_json(json.loads(json.dumps(comparison.to_json()))) == comparison
    # the same dumps on both devices: the two devices compute the same bits
    same = _pair(chain_dumps, "all", "all2", "all2", "all")
    (identical,) = compare_across_devices([_outcome("chain", same, devices, roles=ROLES)])
    assert identical.identical and str(identical).endswith(
        "(CUDA EP dumps; two fresh sessions on each): bit-identical, each device's two sessions too; the two devices compute the same bits")
    # a device whose dumps are missing: not compared, and said so
    (missing,) = compare_across_devices([_outcome("chain", {"a": chain_dumps["all"]}, devices, roles=("gpu",))])
    assert missing.error == "chain made no CUDA-EP dumps on both devices (pass)" and not missing.identical
    # an entry on one device is not compared with anything
    assert compare_across_devices([_outcome("chain", {"a": chain_dumps["all"]}, devices[:1], roles=("gpu",))]) == []


def test_the_comparison_across_gpu_types_names_spans_too(chain_dumps):
    """Before: across GPU types listed origins only, and a span (here the whole finding) went unnamed."""
    h100, h200 = _pair(chain_dumps, "all", "all2"), _pair(chain_dumps, "disable", "disable2")
    (comparison,) = compare_across_gpus([_outcome("chain@H100", h100, [], roles=ROLES[:2], gpu_type="H100"),
                                         _outcome("chain@H200", h200, [], roles=ROLES[:2], gpu_type="H200")])
    assert (comparison.scope, comparison.gpu_a, comparison.gpu_b, comparison.spans) == ("type", "H100", "H200", ("conv0",))
    assert str(comparison).startswith("chain: H100 vs H200 (CUDA EP dumps; two fresh sessions on each): 3 node(s) differ "
                                      "between the GPU types, first conv0; depends on the GPU type: spans: conv0 (nodes inside: "
                                      "x_DequantizeLinear")
    # runs recorded before the nightly dumped twice: the cause is unknown, and said so
    (old,) = compare_across_gpus([_outcome("chain@H100", h100, [], roles=("gpu",), gpu_type="H100"),
                                  _outcome("chain@H200", h200, [], roles=("gpu",), gpu_type="H200")])
    assert (old.device_spans, old.blame) == ((), "unknown") and str(old).endswith(
        "whether from the GPU type or from run-to-run variation is unknown (H100: no second dump among the entry's runs; "
        "H200: no second dump among the entry's runs)")


def test_the_night_page_shows_each_entry_gpu_and_the_comparison_across_devices(chain_dumps, tmp_path):
    devices = visible_from("1,0", HOST)
    outcome = _outcome("chain", _pair(chain_dumps, "all", "all2", "disable", "disable2"), devices, roles=ROLES)
    comparisons = compare_across_devices([outcome], {"chain": "EXHAUSTIVE/tf32=0"})
    data = {"night_id": "night", "config": "nightly.toml", "entries": [outcome.to_json()], "summary": {"pass": 1},
            "passed": True, "across_gpus": [c.to_json() for c in comparisons], "seconds": 12.5, "executor": "ray"}
    html = render_nightly_report(data)
    assert f"<td>GPU 1 ({HOST[1].uuid}), GPU 0 ({HOST[0].uuid})</td>" in html
    assert "<td>GPU 1 (GPU-1f00aa11) vs GPU 0 (GPU-8d3c0f2a)</td>" in html
    assert ("<td>spans: conv0 (inside: x_DequantizeLinear, w0_DequantizeLinear, b0_DequantizeLinear, conv0, "
            "c0_QuantizeLinear)</td>") in html
    assert ('<td class="status-fail">3 node(s) differ, first conv0; depend on the GPU: conv0</td>') in html
    assert "Wall time of the night: 12.5 s (ray executor; the entries together: 0.0 s)" in html
    assert EntryOutcome.from_json(outcome.to_json()).devices == devices
