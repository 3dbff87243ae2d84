"""``evaluate_gate``: judge a candidate against its baseline under a policy, listing every reason."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from qconsist.gate import checks
from qconsist.gate.evidence import Side, load_side
from qconsist.gate.isa import check_isa_spread
from qconsist.gate.policy import Policy
from qconsist.gate.verdict import GateVerdict
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.rundir import utc_now
from qconsist.diff import diff_runs
from qconsist.inference.session import ort_logged

log = logging.getLogger(__name__)


def run_divergence(reference: Path, candidate: Path) -> dict[str, Any]:
    """Tensor-level comparison of two inference runs with dumps (``qconsist diff``), summarised for the gate."""

    result = diff_runs(reference, candidate)
    tensors = result.tensors
    return {
        "identical": result.passed,
        "first_diverging_node": tensors.first.label if tensors and tensors.first else None,
        "origin_nodes": [node.label for node in tensors.origins] if tensors else [],
        "span_nodes": [node.label for node in tensors.spans] if tensors else [],  # unobserved tensors in between
        "tensors": tensors.compared if tensors else None,
        "diff": result.to_json(),
    }


def _divergence(reference: Side | None, candidate: Side, role: str, other_role: str | None = None) -> dict[str, Any] | None:
    if reference is None:
        return None
    a = reference.inference.get(role)
    b = candidate.inference.get(other_role or role)
    if a is None or b is None:
        return {"unavailable": "no inference runs with dumps on both sides; `qconsist nightly` records them"}
    return run_divergence(a, b)


@ort_logged()  # one capture for all its sessions and runs
def evaluate_gate(candidate: Side | Path | str, baseline: Side | Path | str | None, policy: Policy,
                  progress: Progress = NULL_PROGRESS) -> GateVerdict:
    """Every check of the policy on ``candidate`` against ``baseline`` (None: first run, nothing to compare)."""
    cand = candidate if isinstance(candidate, Side) else load_side(candidate)
    base = baseline if isinstance(baseline, Side) or baseline is None else load_side(baseline)
    with progress.task(f"gate {cand.model}", 12) as task:
        baseline_divergence = _divergence(base, cand, "quantized")
        task.advance()
        repeat_divergence = _divergence(cand, cand, "quantized", "repeat") if "repeat" in cand.inference else None
        task.advance()
        artifacts, changed = checks.check_artifacts(cand, base, policy, baseline_divergence)
        itself = checks.check_baseline_is_another_run(cand, base)
        results = [*([itself] if itself else []), artifacts]
        task.advance()
        for check in (
            lambda: checks.check_calibration_repeat(cand, policy),
            lambda: checks.check_quantization_params(cand, policy),
            lambda: checks.check_inference_repeat(cand, policy, repeat_divergence),
            lambda: checks.check_output_finite(cand, policy),
            lambda: checks.check_drift_float(cand, policy),
            lambda: checks.check_drift_baseline(cand, base, policy, baseline_divergence),
            lambda: checks.check_labels(cand, policy),
            lambda: checks.check_gpu(cand, policy),
            lambda: checks.check_environment(cand, base, policy),
            # only where the policy lists instruction sets, so verdicts under other policies keep their checks
            *([lambda: check_isa_spread(cand, policy)] if policy.isa.spread else []),
        ):
            results.append(check())
            task.advance()
    first = origins = None
    if baseline_divergence and not baseline_divergence.get("identical") and not baseline_divergence.get("unavailable"):
        first = baseline_divergence.get("first_diverging_node")
        origins = baseline_divergence.get("origin_nodes")
    return GateVerdict(
        model=cand.model, candidate=str(cand.path), baseline=str(base.path) if base else None,
        policy=policy.to_json(), checks=results, created=utc_now(), changed_stages=changed,
        first_diverging_node=first, origin_nodes=list(origins or []),
        diff=(baseline_divergence or {}).get("diff"), same_run=itself is not None,
    )
