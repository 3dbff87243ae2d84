"""Production's inputs page-locked on the CUDA EP (``qconsist.inference.pinned``): when the input workers' ring is
registered, that the steps handed to the session are views of it, and that it is unregistered before it is unmapped
whatever ends the run (its end, an error in a step, Ctrl-C); on the CPU EP nothing is registered and CuPy is never
imported. The registration itself runs on the GPU machine (``tests/gpu/test_pinned_inputs.py``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from onnx_builders import build_classifier_model
from photo_files import photo
from qconsist.errors import InputError
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inference import pinned, runner
from qconsist.inputs import Preprocess, open_input_set
from qconsist.inputs.stream import shared_ring
from qconsist.store.run import Run

PREPROCESS = Preprocess(resize=(8, 8))
CUDA = ExecutionOptions("cuda")
REFUSED = "cudaErrorHostMemoryAlreadyRegistered: part or all of the requested memory range is already mapped"


def _mapping(address: int) -> str | None:
    """The path of the mapping of this process that holds ``address`` (``/proc/self/maps``), None if unmapped."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(v, 16) for v in fields[0].split("-"))
        if start <= address < end:
            return fields[5].removesuffix(" (deleted)") if len(fields) > 5 else ""  # unlinked once workers map it
    return None


class FakeRuntime:
    """A stand-in for CuPy's CUDA runtime (``cupy.cuda.runtime``: hostRegister, hostUnregister,
    pointerGetAttributes, getDevice, setDevice), injected where ``pinned`` looks it up (``pinned.cuda_runtime``),
    recording each call with the real ring's address and size and what ``/proc/self/maps`` holds there at that
    moment. A test double for the CUDA runtime: acceptable here because this machine has no GPU and no CuPy; the
    real registration is tested on the GPU machine (``tests/gpu/test_pinned_inputs.py``)."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.calls: list[tuple] = []
        self.registered: dict[int, int] = {}

    def getDevice(self) -> int:  # noqa: N802 - CuPy's names
        return 0

    def setDevice(self, device: int) -> None:  # noqa: N802
        self.calls.append(("setDevice", device))

    def hostRegister(self, address: int, size: int, flags: int) -> None:  # noqa: N802
        if self.refuse:
            raise RuntimeError(self.refuse)
        self.calls.append(("register", address, size, flags, _mapping(address)))
        self.registered[address] = size

    def pointerGetAttributes(self, address: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(type=pinned.MEMORY_TYPE_HOST if address in self.registered else 0)

    def hostUnregister(self, address: int) -> None:  # noqa: N802
        self.calls.append(("unregister", address, _mapping(address)))
        del self.registered[address]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """24 photographs as JPEG, decoded by the input workers."""
    folder = tmp_path_factory.mktemp("pinned") / "jpegs"
    for n in range(24):
        photo(folder / f"{n:03d}.jpg", n, (40 + n, 30))
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_classifier_model(tmp_path_factory.mktemp("pinned-model") / "m.onnx", batch="n")


@pytest.fixture
def fake(monkeypatch):
    """The fake runtime, and the CPU EP counted among those whose inputs are page-locked, so that a real run of
    this machine goes through the registration, its steps and its teardown."""
    runtime = FakeRuntime()
    monkeypatch.setattr(pinned, "cuda_runtime", lambda: runtime)
    monkeypatch.setattr(pinned, "PROVIDERS", ("cpu", "cuda"))
    monkeypatch.setattr(runner, "PINNED_PROVIDERS", ("cpu", "cuda"))
    return runtime


def _feeds(monkeypatch) -> dict[int, list[tuple[int, int]]]:
    """The address range of every array a session is fed through ``runner._run`` (production's steps, and the
    output probe's CPU session's), by session."""
    seen: dict[int, list[tuple[int, int]]] = {}
    original = runner._run

    def recording(session, feed, path, where=""):
        seen.setdefault(id(session), []).extend((a.ctypes.data, a.ctypes.data + a.nbytes) for a in feed.values())
        return original(session, feed, path, where)

    monkeypatch.setattr(runner, "_run", recording)
    return seen


def _run(model, inputs, tmp_path, run_id="r", workers=2, progress=None):
    request = RunRequest(ExecutionOptions("cpu"), batch_size=4)
    kwargs = {"progress": progress} if progress is not None else {}
    return run_inference(resolve_model(model), inputs.with_workers(workers), request, tmp_path / "runs", run_id=run_id,
                         **kwargs)


def _memory(result) -> dict:
    return json.loads((result.run_dir / "manifest.json").read_text())["sections"]["inference"]["input_memory"]


def test_only_the_cuda_eps_ring_of_borrowed_views_is_page_locked(jpegs):
    """The decision, on real streams: the CUDA EP and worker processes' borrowed steps, whose arrays lie in the
    ring's mapping; steps made in this process (0 or 1 worker, one sample) or copied out of the ring are not, nor
    anything on the CPU EP."""
    inputs = open_input_set(jpegs, PREPROCESS, "x")
    made = inputs.with_workers(2).steps(4, borrowed=True)
    try:
        ring, why = shared_ring(made)
        assert why == "" and pinned.why_pageable(CUDA, made) == ""
        start = np.frombuffer(ring.map, np.uint8).ctypes.data
        size = ring.map.size()
        assert size == ring.slots * ring.slot_bytes == ring.slots * 4 * 3 * 8 * 8 * 4
        for step in made:  # every step's arrays lie in the ring: what the session is fed is what is registered
            data = step.arrays["x"]
            assert start <= data.ctypes.data and data.ctypes.data + data.nbytes <= start + size
        assert pinned.why_pageable(ExecutionOptions("cpu"), made) == "CPU EP"
    finally:
        made.close()
    here = ("the steps are made in this process (no input workers' ring: fewer than 2 workers, a single sample, or "
            "inputs stacked on another axis than 0)")
    for workers in (0, 1):
        other = inputs.with_workers(workers).steps(4, borrowed=True)
        assert shared_ring(other) == (None, here) and pinned.why_pageable(CUDA, other) == here
        other.close()
    single = inputs.subset(0, 1).with_workers(2).steps(4, borrowed=True)
    assert pinned.why_pageable(CUDA, single) == here
    single.close()
    copied = inputs.with_workers(2).steps(4, borrowed=False)
    assert pinned.why_pageable(CUDA, copied) == "the steps are copies of the input workers' ring"
    copied.close()


def test_a_run_registers_the_ring_it_feeds_from_and_unregisters_it_before_unmapping(jpegs, model, tmp_path, fake,
                                                                                     monkeypatch, caplog):
    feeds = _feeds(monkeypatch)
    with caplog.at_level(logging.INFO, logger="qconsist.inference.pinned"):
        result = _run(model, open_input_set(jpegs, PREPROCESS, "x"), tmp_path)
    (_, address, size, flags, where), (_, unregistered, then) = fake.calls
    assert (fake.calls[0][0], fake.calls[1][0]) == ("register", "unregister")
    assert flags == pinned.HOST_REGISTER_PORTABLE and unregistered == address
    assert where.startswith("/dev/shm/qconsist-inputs-") and then == where  # still mapped when unregistered
    assert _mapping(address) != where  # and unmapped since
    assert _memory(result) == {"page_locked": True, "bytes": size, "note": ""}
    assert Run.open(result.run_dir).inference.input_memory.page_locked is True
    # every step production was fed lies in the registered range
    production = [ranges for ranges in feeds.values() if len(ranges) == 6]  # 24 samples in steps of 4
    assert len(production) == 1 and all(address <= a and b <= address + size for a, b in production[0])
    said = [r.getMessage() for r in caplog.records if r.name == "qconsist.inference.pinned"]
    assert said == [f"inputs page-locked: the input workers' ring of {size} bytes ({size / 2**20:.1f} MiB) "
                    "registered with the CUDA runtime (device 0)"]


def test_an_error_in_a_step_after_registration_unregisters_before_unmapping(jpegs, model, tmp_path, fake):
    folder = tmp_path / "bad"
    for n in range(24):
        photo(folder / f"{n:03d}.jpg", n, (40 + n, 30))
    (folder / "013.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # step 3 of 6, after two steps ran
    with pytest.raises(InputError, match=r"^cannot read image .*/013\.jpg"):
        _run(model, open_input_set(folder, PREPROCESS, "x"), tmp_path)
    (_, address, _, _, where), (kind, unregistered, then) = fake.calls
    assert kind == "unregister" and unregistered == address and then == where
    assert _mapping(address) != where and not fake.registered
    assert not (tmp_path / "runs" / "r").exists()


def test_ctrl_c_in_a_step_after_registration_unregisters_before_unmapping(jpegs, model, tmp_path, fake):
    class Interrupting:
        """The progress of a run whose second step is interrupted (Ctrl-C raises KeyboardInterrupt there)."""

        def task(self, description, total):
            from contextlib import contextmanager

            @contextmanager
            def handle():
                steps = []

                class Handle:
                    def advance(self, amount=1):
                        steps.append(amount)
                        if len(steps) == 2:
                            raise KeyboardInterrupt

                yield Handle()

            return handle()

    with pytest.raises(KeyboardInterrupt):
        _run(model, open_input_set(jpegs, PREPROCESS, "x"), tmp_path, progress=Interrupting())
    (_, address, _, _, where), (kind, unregistered, then) = fake.calls
    assert kind == "unregister" and unregistered == address and then == where
    assert _mapping(address) != where and not fake.registered


def test_a_refused_registration_runs_pageable_and_says_why_once(jpegs, model, tmp_path, fake, caplog):
    fake.refuse = REFUSED
    with caplog.at_level(logging.INFO, logger="qconsist.inference.pinned"):
        result = _run(model, open_input_set(jpegs, PREPROCESS, "x"), tmp_path)
    memory = _memory(result)
    note = memory["note"]
    assert memory["page_locked"] is False and memory["bytes"] == 0
    assert note.startswith("cudaHostRegister of the input workers' ring (") and note.endswith(
        f"bytes) was refused: RuntimeError: {REFUSED}")
    assert fake.calls == [] and not fake.registered
    said = [r.getMessage() for r in caplog.records if r.name == "qconsist.inference.pinned"]
    assert said == [f"inputs pageable: {note}"]


def test_without_cupy_the_run_goes_on_pageable(jpegs, model, tmp_path, monkeypatch):
    """This machine has no CuPy: the real lookup fails, and the run says so instead of failing."""
    monkeypatch.setattr(pinned, "PROVIDERS", ("cpu", "cuda"))
    monkeypatch.setattr(runner, "PINNED_PROVIDERS", ("cpu", "cuda"))
    monkeypatch.setitem(sys.modules, "cupy", None)  # as where it is not installed, whatever this machine has
    result = _run(model, open_input_set(jpegs, PREPROCESS, "x"), tmp_path)
    memory = _memory(result)
    assert memory["page_locked"] is False and memory["note"].startswith("CuPy is not available (ModuleNotFoundError")
    assert memory["note"].endswith("): install qconsist[gpu]")


def test_a_ring_unregisters_before_it_unmaps_and_registers_nothing_once_closed(jpegs):
    """The ring's own guarantee (``stream._Ring``): its ``close`` calls the unregistration first; a registration
    after the close registers nothing; a refused unregistration leaves the mapping mapped."""
    inputs = open_input_set(jpegs, PREPROCESS, "x")
    for refused in (False, True):
        made = inputs.with_workers(2).steps(4, borrowed=True)
        ring, _ = shared_ring(made)
        seen = []

        def register(address, size):
            seen.append(("register", address, size))
            return lambda: seen.append(("release", _mapping(address) is not None and not ring.map.closed)) or not refused

        assert ring.page_lock(register) is True and ring.page_lock(register) is True  # once
        made.close()
        assert seen[1:] == [("release", True)] and len(seen) == 2
        assert ring.map.closed is not refused
        assert ring.page_lock(register) is False and len(seen) == 2


def test_on_the_cpu_ep_no_part_pins_and_cupy_is_never_imported(jpegs, model, tmp_path):
    """A run on the CPU EP with input workers, in a process of its own with a ``cupy`` package on its path that
    says when it is imported: nothing imports it, no ``pin inputs`` part runs, and the manifest says why."""
    fake_cupy = tmp_path / "site" / "cupy"
    fake_cupy.mkdir(parents=True)
    marker = tmp_path / "imported"
    (fake_cupy / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('cupy')\n")
    script = f"""
import json, sys, logging
sys.path.insert(0, {str(tmp_path / 'site')!r})
logging.basicConfig(level=logging.INFO)
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inputs import Preprocess, open_input_set
inputs = open_input_set({str(jpegs)!r}, Preprocess(resize=(8, 8)), "x").with_workers(2)
result = run_inference(resolve_model({str(model)!r}), inputs, RunRequest(ExecutionOptions("cpu"), batch_size=4),
                       __import__("pathlib").Path({str(tmp_path / 'runs')!r}), run_id="cpu")
manifest = json.loads((result.run_dir / "manifest.json").read_text())
print(json.dumps({{"cupy": sorted(m for m in sys.modules if m.split(".")[0] == "cupy"),
                  "memory": manifest["sections"]["inference"]["input_memory"]}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"cupy": [], "memory": {"page_locked": False, "bytes": 0, "note": "CPU EP"}}
    assert not marker.exists()
    startup = [line for line in done.stderr.splitlines() if "start-up: " in line]
    assert len(startup) == 1 and "beside: " in startup[0] and "pin inputs" not in startup[0]
    assert "inputs pageable" not in done.stderr and "page-locked" not in done.stderr
