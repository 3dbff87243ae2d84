"""gate's gpu.pinned check on a locate report measured on an H100 (tests/data, extract of the real report).

A pinned configuration passes when locate found it bit-stable and within the report's accepted cost of the
fastest; latency medians of equally fast configs move from run to run (seen on the GPU machine: two nights
recommended EXHAUSTIVE/tf32=0, then HEURISTIC/tf32=0), so the check must not demand the single fastest one.
"""

import json
from pathlib import Path

import pytest

from qconsist.gate.checks import check_gpu
from qconsist.gate.evidence import Side
from qconsist.gate.policy import GpuPolicy, Policy
from qconsist.gate.verdict import CheckStatus
from qconsist.store.manifest import Manifest
from qconsist.store.run import Run
from qconsist.store.rundir import RunDirectory

# the extract was timed one configuration after another (before side-by-side timing): today's rule, said so
UNPAIRED = " (medians compared: the configurations were not timed side by side)"

REPORT = json.loads((Path(__file__).resolve().parents[1] / "data" / "locate_h100_open_nsfw_qdq.json").read_text())


# what the extract leaves out (the gate reads a whole LocateReport): empty
_LEFT_OUT = {"model": {}, "inputs": {}, "reference": "", "repeats": 0, "contention": None, "comparisons": [], "tf32": {"override": {"value": None}},
             "nodes": []}


def _locate_run(tmp_path, report: dict) -> Path:
    """A locate run as ``run_locate`` writes it: the report in locate.json, its summary in the manifest."""
    run = RunDirectory.create(tmp_path / "runs", "locate", kind="locate")
    whole = {**_LEFT_OUT, **report, "configs": [{"faithful": {}, "repeats": [], **c} for c in report["configs"]]}
    (run.path / "locate.json").write_text(json.dumps(whole))
    run.finish(Manifest(kind="locate", sections={"locate": {"recommendation": report["recommendation"]}}))
    return run.path


@pytest.fixture()
def locate_run(tmp_path):
    return _locate_run(tmp_path, REPORT)


def _side(tmp_path, locate_run, pinned):
    manifest = Manifest(kind="pipeline", run_id="p", status="complete")
    run = Run(tmp_path, manifest)
    return Side(run=run, pipeline=run, locate_path=locate_run, pinned_gpu=pinned)


def _median(label):
    return next(c["latency"]["median_ms"] for c in REPORT["configs"] if c["label"] == label)


def test_recommended_config_passes(tmp_path, locate_run):
    result = check_gpu(_side(tmp_path, locate_run, "HEURISTIC/tf32=0"), Policy())
    assert result.status is CheckStatus.PASS
    assert result.message == ("pins HEURISTIC/tf32=0: bit-stable, 1.00x the fastest (HEURISTIC/tf32=0), accepted up to "
                              f"1.05x{UNPAIRED}")
    assert result.measured == {"recommended": "HEURISTIC/tf32=0", "pinned": "HEURISTIC/tf32=0"}


def test_stable_but_slower_configs_are_judged_by_their_measured_cost(tmp_path, locate_run):
    fastest = _median("HEURISTIC/tf32=0")
    for label in ("EXHAUSTIVE/tf32=0", "DEFAULT/tf32=0"):
        cost = _median(label) / fastest
        result = check_gpu(_side(tmp_path, locate_run, label), Policy())
        assert cost > 1.05 and result.status is CheckStatus.FAIL
        assert result.message == (f"pinned {label} is bit-stable but {cost:.2f}x the fastest (HEURISTIC/tf32=0), "
                                  f"above the accepted 1.05x{UNPAIRED}; locate recommends HEURISTIC/tf32=0")
    # a config within the accepted cost passes although it is not the fastest
    REPORT_CLOSE = dict(REPORT, recommendation=dict(REPORT["recommendation"], max_cost=1.10))
    result = check_gpu(_side(tmp_path, _locate_run(tmp_path, REPORT_CLOSE), "EXHAUSTIVE/tf32=0"), Policy())
    assert result.status is CheckStatus.PASS and "1.07x the fastest" in result.message


def test_a_slower_median_within_the_timing_noise_passes(tmp_path):
    """Seen in a Ray night on an H100: a tiny model's pinned config "1.49x the fastest" while the other entry ran
    beside it; when the quartiles overlap, the medians differ by less than the noise and the pin is accepted."""
    report = json.loads(json.dumps(REPORT))
    exhaustive = next(c for c in report["configs"] if c["label"] == "EXHAUSTIVE/tf32=0")
    fastest = next(c for c in report["configs"] if c["label"] == "HEURISTIC/tf32=0")["latency"]
    exhaustive["latency"].update(p25_ms=fastest["p75_ms"] * 0.99, median_ms=fastest["median_ms"] * 1.49,
                                 p75_ms=fastest["median_ms"] * 2.5)
    result = check_gpu(_side(tmp_path, _locate_run(tmp_path, report), "EXHAUSTIVE/tf32=0"), Policy())
    assert result.status is CheckStatus.PASS
    assert result.message == (
        "pins EXHAUSTIVE/tf32=0: bit-stable, 1.49x the fastest (HEURISTIC/tf32=0) by median, above the accepted "
        f"1.05x, but not measurably slower: its 25th percentile {fastest['p75_ms'] * 0.99:.3g} ms is within the "
        f"fastest's quartiles (75th percentile {fastest['p75_ms']:.3g} ms){UNPAIRED}")


def test_missing_or_invalid_pin_and_policy_off(tmp_path, locate_run):
    missing = check_gpu(_side(tmp_path, locate_run, None), Policy())
    assert missing.status is CheckStatus.FAIL
    assert missing.message == 'locate recommends HEURISTIC/tf32=0 but the model pins no GPU config; set gpu_config = "HEURISTIC/tf32=0"'
    invalid = check_gpu(_side(tmp_path, locate_run, "FASTEST/tf32=2"), Policy())
    assert invalid.status is CheckStatus.FAIL and invalid.message.startswith("pinned GPU config is invalid: ")
    off = check_gpu(_side(tmp_path, locate_run, None), Policy(gpu=GpuPolicy(require_pinned=False)))
    assert off.status is CheckStatus.NOT_APPLICABLE


def test_unstable_pin_fails(tmp_path):
    unstable = dict(REPORT, recommendation=dict(REPORT["recommendation"], stable_configs=["HEURISTIC/tf32=0"]))
    result = check_gpu(_side(tmp_path, _locate_run(tmp_path, unstable), "EXHAUSTIVE/tf32=1"), Policy())
    assert result.status is CheckStatus.FAIL
    assert result.message.startswith("pinned EXHAUSTIVE/tf32=1 was not bit-stable across fresh sessions")


def _upscore_differs(label: str) -> dict:
    """A comparison of two sessions of ``label`` in which ``upscore`` is the origin (as ``PairResult.to_json``)."""
    node = {"node": "upscore", "label": "upscore", "op_type": "ConvTranspose", "origin": True, "origin_samples": [0],
            "tensors": []}
    return {"reference": label, "other": label, "samples": 1, "tensors_compared": 1, "identical": False,
            "first_node": "upscore", "nodes": [node], "int8_changed": 0, "effect": {"samples": 1}}


def _varying(report: dict, label: str) -> dict:
    """The report, with the ConvTranspose ``upscore`` varying under ``label`` between runs of one session and
    between fresh sessions, as locate records it on the FCN head."""
    configs = []
    for config in report["configs"]:
        if config["label"] == label:
            runs = {"config": label, "phase": "run-to-run", "sessions": 3, "stable": False, "differing_sessions": [1, 2],
                    "origins": ["upscore"], "comparisons": [_upscore_differs(label)]}
            quiet = {"config": label, "phase": "quiet", "sessions": 4, "stable": False, "differing_sessions": [1],
                     "origins": ["upscore"], "comparisons": [_upscore_differs(label)]}
            config = dict(config, stable=False, repeats=[runs, quiet])
        configs.append(config)
    nodes = [{"label": "upscore", "op_type": "ConvTranspose", "why": "run-to-run", "between": [], "differing": 1,
              "elements": 1, "greatest_abs": 1e-6, "int8_downstream": 0, "samples": 1}]
    stable = [c for c in report["recommendation"]["stable_configs"] if c != label]
    return dict(report, configs=configs, nodes=nodes, recommendation=dict(report["recommendation"], stable_configs=stable))


def test_a_pin_under_which_a_node_varied_fails_naming_the_node(tmp_path):
    report = _varying(REPORT, "HEURISTIC/tf32=0")
    result = check_gpu(_side(tmp_path, _locate_run(tmp_path, report), "HEURISTIC/tf32=0"), Policy())
    assert result.status is CheckStatus.FAIL
    assert result.message.startswith(
        "under the pinned HEURISTIC/tf32=0 the locate report saw node(s) upscore (ConvTranspose) vary between runs of "
        "one session; node(s) upscore (ConvTranspose) vary between fresh sessions; locate recommends")


def test_a_model_whose_unstable_nodes_were_rewritten_passes_and_says_so(tmp_path, locate_run):
    stage = {"name": "determinize", "params": {"rewritten": ["deconvolution3"]}, "artifact": None, "checks": {}}
    manifest = Manifest(kind="pipeline", run_id="p", status="complete", stages=[stage])
    run = Run(tmp_path, manifest)
    side = Side(run=run, pipeline=run, locate_path=locate_run, pinned_gpu="HEURISTIC/tf32=0")
    result = check_gpu(side, Policy())
    assert result.status is CheckStatus.PASS
    assert result.message.endswith(f"accepted up to 1.05x{UNPAIRED}; the determinize stage rewrote deconvolution3")
    assert result.measured["rewritten"] == ["deconvolution3"]
