"""The probe models that verify the table of known non-deterministic operators: each builds, and on the CPU
they run as the table says the CPU does (the CUDA rows are checked on the GPU: test_on_gpu.py)."""

from __future__ import annotations

import pytest

from qconsist.locate.nondeterminism import KNOWN
from qconsist.locate.probes import PROBES, measure_stability
from qconsist.inference.session import ExecutionOptions


def test_every_row_has_a_probe():
    assert set(PROBES) == {row.id for row in KNOWN}


@pytest.mark.parametrize("row", sorted(set(PROBES) - {"group_norm", "random_operators", "scatter_nd_atomic_reduction"}))
def test_probe_runs_and_is_stable_on_one_cpu_thread(row):
    model, feeds = PROBES[row]()
    result = measure_stability(model, feeds, ExecutionOptions(intra_op_threads=1), "cpu/threads=1", sessions=2, runs=3)
    assert result.error is None and result.distinct == 1 and result.stable


def test_random_operators_differ_by_design_and_group_norm_needs_cuda():
    model, feeds = PROBES["random_operators"]()
    assert measure_stability(model, feeds, ExecutionOptions(), "cpu", sessions=1, runs=3).distinct == 3
    model, feeds = PROBES["group_norm"]()
    result = measure_stability(model, feeds, ExecutionOptions(), "cpu", sessions=1, runs=1)
    assert not result.stable and "Could not find an implementation for GroupNorm(1)" in result.error
