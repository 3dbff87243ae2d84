"""The GPU load worker: without a GPU it fails to start and says why."""

from __future__ import annotations

import pytest

from qconsist.errors import UnavailableError
from qconsist.gpu.contention import GpuLoad, _shapes, main
from qconsist.gpu.device import cuda_available


@pytest.mark.skipif(cuda_available(), reason="this machine has a usable CUDA GPU")
def test_load_worker_refuses_to_start_without_a_gpu():
    with pytest.raises(UnavailableError, match=r"^the GPU load worker did not start: load worker failed: "):
        with GpuLoad():
            pass


@pytest.mark.skipif(cuda_available(), reason="this machine has a usable CUDA GPU")
def test_worker_main_exits_3_without_a_gpu(capsys):
    assert main(["--backend", "onnxruntime"]) == 3
    assert capsys.readouterr().err.startswith("load worker failed: no CUDA GPU")


def test_shapes_change_and_are_seeded():
    import numpy as np

    first = [_shapes(np.random.default_rng(1)) for _ in range(1)]
    rng = np.random.default_rng(1)
    drawn = [_shapes(rng) for _ in range(20)]
    assert drawn[0] == first[0]
    assert len(set(drawn)) > 10
