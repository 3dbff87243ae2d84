"""diff reads the cuDNN engines each run recorded (``qconsist run --engines``) and says, per convolution node,
whether the two runs executed different kernels or one kernel that cuDNN marks non-deterministic."""

from __future__ import annotations

import pytest

from qconsist.diff.runs import compare_engines
from qconsist.inference.engines import EngineRecord, NodeEngines
from qconsist.inference.runner import RunRequest
from qconsist.errors import ConfigError
from qconsist.inference.session import ExecutionOptions
from qconsist.store.manifest import Manifest

WHY = "cuDNN marks engine 25 CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (it accumulates with atomics: non-deterministic by design)"


def _manifest(conv_engine: str, deconv_why: str | None) -> Manifest:
    nodes = (
        NodeEngines("convolution1", "conv1", "Conv", (conv_engine,) * 3, (), (), None),
        NodeEngines("deconvolution3", "upscore", "ConvTranspose", ("engine 25",) * 3, (), (), deconv_why),
        NodeEngines("convolution4", "score", "Conv", ("engine 28",) * 3, (), (), None),
    )
    record = EngineRecord("cuda/cudnn_conv_algo_search=EXHAUSTIVE", 3, nodes, (), ("a", "b", "c"), 2.0, 1.0, 100)
    return Manifest(kind="inference", sections={"engines": record.to_json()})


def test_different_kernels_and_a_non_deterministic_one_are_named():
    changes, notes = compare_engines(_manifest("engine 28", WHY), _manifest("engine 41", WHY), {"upscore"})
    assert notes == []
    assert [c.node for c in changes] == ["conv1", "upscore"]  # score: same kernel, deterministic, not an origin
    conv, deconv = changes
    assert conv.describe() == ("conv1 (Conv): A engine 28 in all 3 runs; B engine 41 in all 3 runs — the two runs "
                               "executed different kernels")
    assert deconv.origin and deconv.same
    assert deconv.describe() == (f"upscore (ConvTranspose): A engine 25 in all 3 runs; B engine 25 in all 3 runs; {WHY} "
                                 "— the same kernel gives different results from run to run; an origin of the tensor comparison")


def test_a_kernel_inside_a_span_is_named_with_its_span():
    """A deterministic kernel unchanged between the runs still matters when it lies inside a span (unobserved
    tensors between identical inputs and a differing output): the blame may be its."""
    same = _manifest("engine 28", None)
    changes, _ = compare_engines(same, _manifest("engine 28", None), set(), {"score": "score", "upscore": "score"})
    assert [(c.node, c.origin, c.span) for c in changes] == [("upscore", False, "score"), ("score", False, "score")]
    assert changes[1].describe() == ("score (Conv): A engine 28 in all 3 runs; B engine 28 in all 3 runs; inside the "
                                     "span score of the tensor comparison")
    assert compare_engines(same, _manifest("engine 28", None), set()) == ([], [])  # nothing blamed: nothing said


def test_one_sided_records_leave_a_note_and_none_say_nothing():
    changes, notes = compare_engines(_manifest("engine 28", None), Manifest(kind="inference"), set())
    assert changes == [] and "rerun the other with --engines" in notes[0]
    assert compare_engines(Manifest(kind="inference"), Manifest(kind="inference"), set()) == ([], [])


def test_engines_need_the_cuda_provider_and_sane_runs():
    with pytest.raises(ConfigError, match="engines records the kernels cuDNN runs: it needs ep cuda"):
        RunRequest(options=ExecutionOptions(), engines=True)
    with pytest.raises(ConfigError, match="engine_runs must be a whole number from 1 to 100"):
        RunRequest(options=ExecutionOptions(), engine_runs=0)
