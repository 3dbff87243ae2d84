"""The fix for one node instead of the session: when a node varies from run to run and the only stable
configuration is slow, rewrite that node (``qconsist.stages.determinize``) and measure the rewritten model
under the same configurations, side by side with the original in the same ``locate``.

The rewritten model is checked against the original twice: determinize's own check (every replaced node and
every output on seeded inputs, CPU) and the final outputs on the inputs ``locate`` ran, on the CPU, with the
greatest difference and the top-1 agreement stated.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from qconsist.compare import compare_outputs
from qconsist.errors import QconsistError
from qconsist.locate.decision import ConfigOutcome, Recommendation, recommend
from qconsist.locate.report import ConfigReport, NoAlternative, RewriteAlternative, SensitiveNode
from qconsist.inputs.inputset import InputSet
from qconsist.inference.session import ort_logged, outputs_of
from qconsist.stages.determinize import DeterminizeOptions, determinize
from qconsist.store.scratch import scratch_dir

log = logging.getLogger(__name__)

REWRITABLE = ("ConvTranspose", "ScatterElements")
RUN_TO_RUN = ("repeat", "run-to-run")


def wanted(nodes: Sequence[SensitiveNode], recommendation: Recommendation | None) -> bool:
    """A node of a rewritable kind varies between runs or sessions, and no stable config is accepted as fast."""
    unstable = [n for n in nodes if n.why in RUN_TO_RUN and n.op_type in REWRITABLE]
    if not unstable:
        return False
    return recommendation is None or not recommendation.accepted or recommendation.config != recommendation.fastest


@ort_logged()  # one capture for all its sessions and runs
def measure_alternative(
    model_path: Path,
    samples: Sequence[dict[str, np.ndarray]],
    original: Recommendation,
    explore_rewritten: Callable[[Path], tuple[list[ConfigReport], Recommendation]],
) -> RewriteAlternative | NoAlternative:
    """Rewrite ``model_path``'s unstable nodes, check the rewrite on the CPU, and measure it with
    ``explore_rewritten`` (the same configurations, repeats and latency as the original)."""
    with scratch_dir("qconsist-rewrite-") as tmp:
        target = Path(tmp) / "determinized.onnx"
        try:
            result = determinize(model_path, target, DeterminizeOptions(skip_unsupported=True), dict(samples[0]))
        except QconsistError as exc:
            return NoAlternative(f"determinize could not rewrite the model: {exc}")
        refused = tuple(f"{n.name}: {n.reason}" for n in result.refused)
        if not result.rewritten:
            hint = ""
            if any("computed at run time" in n.reason for n in result.refused):
                hint = ("; in a quantized model the weights come from DequantizeLinear: rewrite the float model "
                        "before quantization ([determinize] in the pipeline)")
            return NoAlternative("no node could be rewritten" + (f" ({'; '.join(refused)})" if refused else "") + hint)
        listed = [dict(s) for s in samples]
        inputs = InputSet("locate inputs", "arrays", [f"{i:06d}" for i in range(len(listed))], listed.__getitem__)
        comparison = compare_outputs(outputs_of(model_path, inputs), outputs_of(target, inputs), None, None)
        configs, recommendation = explore_rewritten(target)
    return RewriteAlternative(
        rewritten=tuple(f"{r.name} ({r.form})" for r in result.rewritten), refused=refused,
        check_max_abs=result.max_abs, outputs_max_abs=comparison.effect.greatest_abs, top1_agree=comparison.effect.top1_agree,
        samples=comparison.effect.samples, configs=tuple(configs), recommendation=recommendation,
        original_fastest=original.fastest, original_fastest_ms=original.fastest_ms,
    )


def recommend_reports(reports: Sequence[ConfigReport], timing_based: dict[str, bool], max_cost: float) -> Recommendation:
    return recommend([
        ConfigOutcome(r.label, r.stable and bool(r.faithful.get("faithful", False)), r.latency.median_ms,
                      timing_based.get(r.label, False), False, r.latency.p25_ms, r.latency.p75_ms, r.latency.rounds_ms)
        for r in reports if r.latency is not None
    ], max_cost)
