"""The GPU load worker: without a GPU it fails to start and says why."""

from __future__ import annotations

import pytest

from qconsist.errors import UnavailableError
from qconsist.locate.contention import GpuLoad, _shapes, main
from qconsist.inference.session import provider_available


@pytest.mark.skipif(provider_available("cuda"), reason="this machine has a usable CUDA GPU")
def test_load_worker_refuses_to_start_without_a_gpu():
    with pytest.raises(UnavailableError, match=r"^the GPU load worker did not start: load worker failed: "):
        with GpuLoad():
            pass


@pytest.mark.skipif(provider_available("cuda"), reason="this machine has a usable CUDA GPU")
def test_worker_main_exits_3_without_a_gpu(capsys):
    assert main(["--backend", "onnxruntime"]) == 3
    assert capsys.readouterr().err.startswith("load worker failed: execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime")


def test_shapes_change_and_are_seeded():
    import numpy as np

    first = [_shapes(np.random.default_rng(1)) for _ in range(1)]
    rng = np.random.default_rng(1)
    drawn = [_shapes(rng) for _ in range(20)]
    assert drawn[0] == first[0]
    assert len(set(drawn)) > 10


def test_several_workers_are_validated_and_recorded():
    from qconsist.errors import ConfigError
    from qconsist.locate.contention import LoadSummary
    from qconsist.locate.explore import LocateOptions

    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        GpuLoad(workers=0)
    with pytest.raises(ConfigError, match=r"contention_workers must be an integer from 1 to 16, got 0"):
        LocateOptions(contention=True, contention_workers=0)
    assert LocateOptions(contention=True, contention_workers=4).to_json()["contention_workers"] == 4
    old = {"backend": "torch", "iterations": 262, "seconds": 11.7, "pid": 7}  # a report written before `workers`
    assert LoadSummary.from_json(old).workers == 1


@pytest.mark.skipif(provider_available("cuda"), reason="this machine has a usable CUDA GPU")
def test_several_workers_without_a_gpu_fail_cleanly():
    import subprocess

    load = GpuLoad(workers=3)
    with pytest.raises(UnavailableError, match=r"^the GPU load worker did not start: "):
        with load:
            pass
    assert all(proc.poll() is not None for proc in load._procs)  # none left running
    assert len(load._procs) == 3 and not any(isinstance(p, subprocess.Popen) and p.poll() is None for p in load._procs)
