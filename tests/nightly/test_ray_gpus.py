"""The nightly across the two GPUs of one machine through Ray (issue 31, item 3), on a real machine with two GPUs
of one type: the Ray night runs its entries at once, one GPU each, and each entry records the GPU it ran on
(two different UUIDs); its verdicts, stage md5s and figures equal a local night's; and the same model dumped on
GPU 0 and GPU 1 (``devices = 2``), twice on each, is compared across the two devices under the entry's pinned GPU
config, a node that varies from run to run told apart from one that depends on the device."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nightly_files import derived_nightly
from qconsist.history import History
from qconsist.nightly import ExecutorOptions, load_nightly, run_nightly
from qconsist.nightly.devices import query_host_gpus
from qconsist.store.rundir import open_run
from run_content import _data

pytestmark = pytest.mark.gpu

# the FCN head (its Deconvolution varies run to run on the CUDA EP: its gate fails gpu.pinned, on either executor)
# and its determinized twin (bit-stable, passes): small, so that the GPU machine's minutes go to both executors
# (benchmarks/nightly_gpus.py compares the bundled open_nsfw entries the same way)
MODELS = ["fcn_head", "fcn_head-determinized"]


@pytest.fixture(scope="module")
def host():
    gpus = query_host_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs a machine with two GPUs; nvidia-smi lists {len(gpus)}")
    return gpus


@pytest.fixture(scope="module")
def nights(host, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpus")
    config = load_nightly(derived_nightly(folder, MODELS))
    results = {}
    for executor in ("local", "ray"):
        runs = folder / f"runs-{executor}"
        night_config = replace(config, runs_dir=runs, history=runs / "history.sqlite")
        results[executor] = (runs, run_nightly(night_config, executor=ExecutorOptions(executor)))
    return results


def test_the_ray_night_runs_its_entries_on_both_gpus_and_each_records_its_gpu(host, nights):
    _, night = nights["ray"]
    assert night.executor == "ray" and all(e.status in ("pass", "fail") for e in night.entries), night.to_json()
    devices = [e.devices for e in night.entries]
    assert all(len(d) == 1 for d in devices), devices
    uuids = [d[0].uuid for d in devices]
    assert len(set(uuids)) == 2 and set(uuids) == {g.uuid for g in host}  # one GPU each, two different GPUs
    by_uuid = {g.uuid: g for g in host}
    for entry in night.entries:
        (device,) = entry.devices
        assert device.index == 0 and device.host_index == by_uuid[device.uuid].host_index
        assert device.name == by_uuid[device.uuid].name
        manifest = open_run(Path(entry.entry_run))
        assert manifest.sections["nightly_entry"]["devices"] == [device.to_json()]
        assert manifest.environment["env"]["CUDA_VISIBLE_DEVICES"] == str(device.host_index)  # Ray's assignment
        assert manifest.sections["nightly_entry"]["locate_run"]  # locate ran on that GPU
    # the entries ran at once: the night took less than the entries one after the other
    assert night.seconds < sum(e.seconds for e in night.entries), (night.seconds, [e.seconds for e in night.entries])
    summary = json.loads((night.path / "summary.json").read_text())
    assert summary["seconds"] == pytest.approx(night.seconds, abs=1e-3)
    assert [d["uuid"] for e in summary["entries"] for d in e["devices"]] == uuids
    html = (night.path / "report.html").read_text()
    assert all(f"({uuid})" in html for uuid in uuids) and "Wall time of the night" in html
    # the local night: every entry on device 0 of this process, the host's first GPU
    _, local = nights["local"]
    assert [[(d.index, d.uuid) for d in e.devices] for e in local.entries] == [[(0, host[0].uuid)]] * 2
    print(f"\nnight on one GPU (local) {local.seconds:.1f} s, entries {[round(e.seconds, 1) for e in local.entries]}; "
          f"on two GPUs (ray) {night.seconds:.1f} s, entries {[round(e.seconds, 1) for e in night.entries]} on "
          f"{[e.devices[0].short for e in night.entries]}; ratio {night.seconds / local.seconds:.3f}")


def _checks(verdict, runs: Path) -> dict:
    """A verdict's checks by name; ``gpu.pinned`` by its status alone: its message and figures are the night's
    latency medians from locate (which config is fastest moves with timing noise, on any executor)."""
    checks = {c["name"]: _data(c, runs) for c in verdict.to_json()["checks"]}
    if "gpu.pinned" in checks:
        checks["gpu.pinned"] = checks["gpu.pinned"]["status"]
    # a task Ray gave a GPU accepts its index as no change of environment (its policy's allow_changed says so)
    allowed = (checks.get("environment") or {}).get("tolerance") or {}
    if isinstance(allowed.get("allow_changed"), list):
        allowed["allow_changed"] = [name for name in allowed["allow_changed"] if name != "CUDA_VISIBLE_DEVICES"]
    return checks


def _why(outcome, executor: str) -> str:
    """Everything the night recorded of why an entry did not pass, for the assertion message: its error, the attempts
    lost with a worker, each failed check with its message and measured figures, the GPU it ran on and its verdict
    file (the run directories are gone with the machine; this line is what is left of them)."""
    verdict = outcome.verdict
    checks = [f"{c.name}: {c.message} (measured {c.measured})" for c in (verdict.checks if verdict else []) if c.failed]
    return (f"{executor} {outcome.model}: status {outcome.status}, error {outcome.error!r}, attempts "
            f"{[str(a) for a in outcome.attempts]}, on {[d.short for d in outcome.devices]}, failed checks {checks}, "
            f"verdict {Path(outcome.entry_run) / 'verdict.md' if outcome.entry_run else None}")


def test_a_ray_night_over_two_gpus_equals_a_local_night(nights):
    (local_runs, local), (ray_runs, ray) = nights["local"], nights["ray"]
    for a, b in zip(local.entries, ray.entries):
        failing = [_why(o, executor) for o, executor in ((a, "local"), (b, "ray")) if o.status != "pass"]
        print(*failing, sep="\n")  # with -s or -rA, also when both failed alike (fcn_head: gpu.pinned)
        assert (a.model, a.status) == (b.model, b.status), failing
        assert b.verdict.passed == a.verdict.passed, a.model
        assert _checks(b.verdict, ray_runs) == _checks(a.verdict, local_runs), a.model
        assert b.figures == a.figures, a.model  # accuracy figures (none for the FCN head: no classes)
    db_local, db_ray = History(local_runs / "history.sqlite"), History(ray_runs / "history.sqlite")
    for model in MODELS:
        (row_local,), (row_ray,) = db_local.model_rows(model), db_ray.model_rows(model)
        assert row_local["hashes"]["quantize"]["md5"] and row_ray["hashes"] == row_local["hashes"], model
        assert row_local["figures"] and row_ray["figures"] == row_local["figures"], model  # the night's figures


def test_the_same_model_on_gpu_0_and_gpu_1_is_compared_across_the_devices(host, tmp_path):
    """open_nsfw (Conv only: bit-stable) under HEURISTIC without TF32 (cuDNN's heuristic picks the same kernels on
    two GPUs of one type; EXHAUSTIVE times them on each), and the FCN head under EXHAUSTIVE, whose upsampling
    Deconvolution differs on every run on the CUDA EP: each dumped twice on both GPUs by one Ray task, so that the
    deconvolution is found varying from run to run on each, not depending on the device."""
    path = derived_nightly(tmp_path, ["open_nsfw-minmax", "fcn_head"], extra={
        "open_nsfw-minmax": {"devices": 2, "locate": False, "gpu_config": "HEURISTIC/tf32=0"},
        "fcn_head": {"devices": "all", "locate": False, "gpu_config": "EXHAUSTIVE/tf32=0"}})
    night = run_nightly(load_nightly(path), executor=ExecutorOptions("ray"))
    for entry in night.entries:
        assert [d.uuid for d in entry.devices] and len({d.uuid for d in entry.devices}) == 2, entry.to_json()
        assert sorted(r.role for r in entry.runs if r.role.startswith("gpu")) == ["gpu", "gpu-repeat", "gpu:1", "gpu:1-repeat"]
    nsfw, fcn = night.across_gpus
    for comparison, entry in ((nsfw, night.entries[0]), (fcn, night.entries[1])):
        assert [(r.where, bool(r.run_a and r.run_b), r.error) for r in comparison.repeats] == [
            (d.short, True, None) for d in entry.devices], str(comparison)  # each device dumped twice
        assert comparison.scope == "device" and comparison.error is None, str(comparison)
        assert (comparison.gpu_a, comparison.gpu_b) == (entry.devices[0].short, entry.devices[1].short)
        assert [d["uuid"] for d in comparison.devices] == [d.uuid for d in entry.devices]
    # open_nsfw (Conv only) under HEURISTIC: the same bits on both devices, and in both sessions on each
    assert nsfw.identical and nsfw.config == "HEURISTIC/tf32=0" and nsfw.blame == "none", str(nsfw)
    assert str(nsfw).endswith("bit-identical, each device's two sessions too; the two devices compute the same bits")
    assert fcn.config == "EXHAUSTIVE/tf32=0" and not fcn.identical, str(fcn)
    named = {*fcn.origins, *fcn.spans, *(node for inside in fcn.span_nodes for node in inside)}
    assert "deconvolution3" in named, str(fcn)
    # the deconvolution varies from run to run on either GPU (../shared/gpu/README.md: 20 distinct outputs in 20 runs
    # under EXHAUSTIVE): it differs between each device's two sessions, and is not blamed on the device
    for repeat in fcn.repeats:
        assert "deconvolution3" in repeat.varying, str(fcn)
    assert "deconvolution3" in fcn.run_to_run and "deconvolution3" not in {*fcn.device_origins, *fcn.device_spans}, str(fcn)
    assert fcn.blame in ("run-to-run", "device and run-to-run"), str(fcn)
    assert f"differ between the devices, first {fcn.first}" in str(fcn) and "not blamed on the device" in str(fcn)
    html = (night.path / "report.html").read_text()
    assert "deconvolution3" in html and entry.devices[1].uuid in html
    print(*(str(c) for c in night.across_gpus), sep="\n")
