"""The rewrite alternative of locate, measured for real on the CPU: the FCN head's overlapping ConvTranspose
rewritten by determinize, checked against the original on the inputs, explored under the same variants; and
how a locate report with engine records and the alternative reads and round-trips."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from fcn_models import fcn_head
from rich.console import Console

from qconsist.cli.locate import render
from qconsist.locate.alternative import measure_alternative, recommend_reports, wanted
from qconsist.locate.config import Tf32Override
from qconsist.locate.decision import Recommendation
from qconsist.inference.engines import EngineRecord, NodeEngines
from qconsist.locate.latency import LatencyOptions
from qconsist.locate.explore import Variant, explore
from qconsist.locate.report import LocateReport, NoAlternative, RewriteAlternative, SensitiveNode
from qconsist.inference.session import ExecutionOptions
from qconsist.stages.convert import convert_caffe
from qconsist.stages.quantize import QuantizeOptions, quantize_model
from qconsist.inputs import open_input_set
from qconsist.store.serde import dumps, encode, loads

VARIANTS = [Variant("threads=1", ExecutionOptions(intra_op_threads=1)), Variant("threads=2", ExecutionOptions(intra_op_threads=2))]


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fcn_head")
    prototxt, caffemodel = fcn_head(seed=0).write(root)
    converted = convert_caffe(prototxt, caffemodel, root / "fcn_head.onnx").path
    calibration = root / "calibration.npy"
    np.save(calibration, np.random.default_rng(7).standard_normal((4, 3, 56, 56)).astype(np.float32))
    quantize_model(converted, root / "fcn_head_int8.onnx", open_input_set(calibration, input_name="data_input"),
                   QuantizeOptions(per_channel=True))
    rng = np.random.default_rng(3)
    samples = [{"data_input": rng.standard_normal((1, 3, 56, 56)).astype(np.float32)} for _ in range(3)]
    return {"float": converted, "qdq": root / "fcn_head_int8.onnx",
            "samples": samples}


def _explorer(samples):
    timing = {v.label: False for v in VARIANTS}

    def explore_rewritten(path: Path):
        reports, *_ = explore(path, samples, VARIANTS, [], repeats=2, latency=LatencyOptions(1, 5), session_runs=2)
        return reports, recommend_reports(reports, timing, 1.05)
    return explore_rewritten


def _original(head) -> Recommendation:
    reports, _, _, _, decision = explore(head["float"], head["samples"], VARIANTS, [], repeats=2,
                                         latency=LatencyOptions(1, 5), session_runs=2)
    assert all(r.stable for r in reports)  # the CPU's ConvTranspose is deterministic
    return decision


def test_the_rewritten_model_is_checked_and_measured_under_the_same_variants(head):
    original = _original(head)
    alt = measure_alternative(head["float"], head["samples"], original, _explorer(head["samples"]))
    assert isinstance(alt, RewriteAlternative)
    assert len(alt.rewritten) == 1 and alt.rewritten[0].startswith("deconvolution3 (sub")
    assert 0 < alt.outputs_max_abs < 1e-5 and alt.check_max_abs < 1e-5
    assert alt.top1_agree == alt.samples == 3
    assert [c.label for c in alt.configs] == ["threads=1", "threads=2"] and alt.stable_configs == ("threads=1", "threads=2")
    assert alt.recommendation.config in {"threads=1", "threads=2"}
    assert alt.cost_vs_original == pytest.approx(alt.recommendation.median_ms / original.fastest_ms)
    assert RewriteAlternative.from_json(loads(dumps(alt))).to_json() == loads(dumps(alt))


def test_a_quantized_model_points_to_the_pipeline_stage(head):
    original = Recommendation(None, None, "threads=1", 1.0, None, 1.05, (), ())
    alt = measure_alternative(head["qdq"], head["samples"], original, _explorer(head["samples"]))
    assert isinstance(alt, NoAlternative)
    assert "computed at run time" in alt.reason and "[determinize] in the pipeline" in alt.reason


def _node(op: str, why: str) -> SensitiveNode:
    return SensitiveNode("upscore", op, why, ("a vs b",), 10, 100, 0.1, 0)


def test_wanted_only_for_a_rewritable_node_that_varies_without_a_fast_stable_config():
    slow = Recommendation("DEFAULT/tf32=0", 90.0, "HEURISTIC/tf32=0", 3.3, 27.0, 1.05, ("DEFAULT/tf32=0",), ())
    fast = Recommendation("HEURISTIC/tf32=0", 3.3, "HEURISTIC/tf32=0", 3.3, 1.0, 1.05, ("HEURISTIC/tf32=0",), ())
    assert wanted([_node("ConvTranspose", "run-to-run")], slow)
    assert wanted([_node("ScatterElements", "repeat")], None)
    assert not wanted([_node("ConvTranspose", "run-to-run")], fast)
    assert not wanted([_node("ConvTranspose", "tf32")], slow)
    assert not wanted([_node("ScatterND", "run-to-run")], slow)


def test_a_report_with_engines_and_the_alternative_reads_and_round_trips(head):
    original = _original(head)
    reports, results, tagged, _, decision = explore(head["float"], head["samples"], VARIANTS, [], repeats=2,
                                                    latency=LatencyOptions(1, 5), session_runs=2)
    alt = measure_alternative(head["float"], head["samples"], original, _explorer(head["samples"]))
    node = NodeEngines("deconvolution3", "upscore", "ConvTranspose", ("engine 25 (tile_size=2, use_tex=0)",) * 3, (),
                       ("CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC",),
                       "cuDNN marks engine 25 CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (it accumulates with atomics: "
                       "non-deterministic by design)")
    record = EngineRecord("threads=1", 3, (node,), (), ("a", "b", "c"), 2.0, 1.0, 1000)
    report = LocateReport(
        model={"name": "fcn_head", "path": "fcn_head.onnx"}, inputs={"count": 3}, device={"name": "CPU"},
        reference="threads=1", repeats=2, contention=None, configs=reports, comparisons=results,
        tf32={"override": Tf32Override(None).to_json(), "pairs": []}, recommendation=decision, nodes=[],
        engines=[record], engine_errors={"threads=2": "cuDNN wrote no API log"}, alternative=alt,
    )
    again = LocateReport.from_json(loads(dumps(report)))
    assert encode(again) == encode(report)
    buffer = io.StringIO()
    render(again, Console(file=buffer, width=220, no_color=True, highlight=False))
    text = buffer.getvalue()
    assert "runs of one session" in text and "2/2 identical" in text
    assert ("upscore: ConvTranspose, threads=1 run 1 engine 25 (tile_size=2, use_tex=0), run 2 engine 25 "
            "(tile_size=2, use_tex=0), run 3 engine 25") in text
    assert "NONDETERMINISTIC (it accumulates with atomics: non-deterministic by design)" in text
    assert "final outputs DIFFER between its runs" in text and "threads=2: no engine record: cuDNN wrote no API log" in text
    assert "rewrite alternative (determinize): deconvolution3" in text
    assert "compare: the original's stable" in text and "bit-stable" in text
