"""The gate's checks. Each takes the candidate (and the baseline where it needs one) and the policy and
returns a ``CheckResult`` with the tolerance it applied and the figures it measured."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import numpy as np

from qconsist.calibration.repeat import RepeatResult
from qconsist.compare import OutputComparison, compare_outputs
from qconsist.compare.kinds import JudgedOutput, class_scores_output
from qconsist.compare.statistics import ZERO_SIGNAL, sqnr_phrase
from qconsist.errors import QconsistError
from qconsist.gate.blame import losing_nodes
from qconsist.gate.evidence import Side, evaluation_inputs, same_role_inputs
from qconsist.gate.policy import DriftLimits, Policy
from qconsist.gate.verdict import CheckResult, CheckStatus
from qconsist.diff.artifacts import compare_artifacts
from qconsist.inference.session import outputs_of
from qconsist.locate.config import GpuConfig
from qconsist.locate.decision import acceptance
from qconsist.store.run import Run
from qconsist.store.sections import Accuracy
from qconsist.store.serde import to_jsonable
from qconsist.compare.accuracy import AccuracyCounter, labels_array
from qconsist.locate.report import ConfigReport, LocateReport
from qconsist.locate.run import load_report
from qconsist.environment import compare_environments

log = logging.getLogger(__name__)

PASS, FAIL, NA = CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.NOT_APPLICABLE


def _short(digest: str | None) -> str:
    return (digest or "none")[:12]


def changed_stages(candidate: Side, baseline: Side, hash_kind: str) -> list[dict[str, Any]]:
    """Stages whose artifact hash differs from the baseline's, in pipeline order, with what else changed:
    parameters, and (``qconsist diff``'s artifact comparison) whether only metadata such as the graph name
    changed or the computation itself."""

    recorded = "md5" if hash_kind == "computation" else hash_kind
    compared = compare_artifacts(baseline.pipeline, candidate.pipeline)
    changes = []
    for stage in candidate.pipeline.stages:
        name = stage["name"]
        other = baseline.stage(name)
        mine = _artifact_of(stage).get(recorded)
        theirs = _artifact_of(other).get(recorded)
        if (mine is None and theirs is None) or mine == theirs:
            continue
        detail = compared.stage(name)
        metadata_only = detail is not None and detail.same_computation
        mine_params, their_params = stage.get("params", {}), (other or {}).get("params", {})
        params = [f"{key} {_value_at(their_params, key)} → {_value_at(mine_params, key)}"  # calibration_count 12 → 8
                  for key in sorted(_differing_keys(mine_params, their_params))]
        changes.append({"stage": name, "from": theirs, "to": mine, "params_changed": params,
                        "metadata_only": metadata_only, "metadata": list(detail.metadata) if detail else []})
    return changes


def _describe_change(change: dict[str, Any], kind: str) -> str:
    shown = "md5" if kind == "computation" else kind
    text = f"stage '{change['stage']}' changed ({shown} {_short(change['from'])} -> {_short(change['to'])}"
    if change["params_changed"]:
        text += f"; parameters changed: {', '.join(change['params_changed'])}"
    if change["metadata_only"]:
        text += "; the computation is the same, only metadata differs: " + "; ".join(m[:160] for m in change["metadata"][:3])
    return text + ")"


def _artifact_of(stage: dict[str, Any] | None) -> dict[str, Any]:
    artifact = (stage or {}).get("artifact")
    return artifact if isinstance(artifact, dict) else {}


def _value_at(params: Any, dotted: str) -> str:
    """The value of a dotted parameter key (``calibration.count``) as text, ``unset`` where it is not there."""
    value = params
    for part in dotted.split(".") if dotted != "value" else []:
        if not isinstance(value, dict) or part not in value:
            return "unset"
        value = value[part]
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "…"


def _differing_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = []
        for key in set(a) | set(b):
            keys += _differing_keys(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return keys
    return [] if a == b else [prefix or "value"]


def _changed_inputs(candidate: Side, baseline: Side) -> list[str]:
    """Which recorded input sets (calibration, evaluation) differ from the baseline's, by digest."""
    return [role for role in ("calibration", "evaluation") if same_role_inputs(candidate, baseline, role) is False]


def _divergence_note(divergence: dict[str, Any] | None) -> str:
    if not divergence or not divergence.get("first_diverging_node"):
        return ""
    listed = divergence.get("origin_nodes") or []
    origins = ", ".join(listed[:4]) + (f" and {len(listed) - 4} more" if len(listed) > 4 else "") or "none"
    spans = divergence.get("span_nodes") or []
    within = (f"; spans ending at: {', '.join(spans[:4])}" + (f" and {len(spans) - 4} more" if len(spans) > 4 else "")) if spans else ""
    return f"; the evaluation dumps first diverge at node {divergence['first_diverging_node']} (origin nodes: {origins}{within})"


def check_baseline_is_another_run(candidate: Side, baseline: Side | None) -> CheckResult | None:
    """A baseline that is the candidate's own pipeline run (the same folder, a copy, or a nightly entry of it)
    makes every baseline check pass by construction: the gate fails, saying so (``None``: another run)."""
    if baseline is None or not candidate.pipeline.same_as(baseline.pipeline):
        return None
    return CheckResult("baseline", FAIL, f"the baseline is the candidate's own run ({candidate.pipeline.run_id}): a run "
                       "compared with itself passes every baseline check by construction; give the previous release's "
                       "run as --baseline, or none for a first release", {}, {"same_run": True})


def check_artifacts(candidate: Side, baseline: Side | None, policy: Policy,
                    divergence: dict[str, Any] | None = None) -> tuple[CheckResult, list[str]]:
    kind = policy.artifacts.hash.value
    expected = list(policy.artifacts.expect_changed)
    tolerance = {"hash": kind, "expect_changed": expected}
    if baseline is None:
        return CheckResult("artifacts", NA, "no baseline: nothing to compare the artifact hashes with", tolerance), []
    everything = changed_stages(candidate, baseline, kind)
    changes = [c for c in everything if not (kind == "computation" and c["metadata_only"])]
    ignored = [c["stage"] for c in everything if c not in changes]
    names = [c["stage"] for c in changes]
    unexpected = [c for c in changes if c["stage"] not in expected]
    inputs = _changed_inputs(candidate, baseline)
    measured = {"changed": changes, "inputs_changed": inputs, "metadata_only": ignored}
    note = f" (md5 differs in metadata only: {', '.join(ignored)})" if ignored else ""
    if inputs and changes:
        for change in changes:
            if change["stage"] == "quantize" and "calibration" in inputs:
                change["params_changed"].append("calibration inputs (digest differs)")
    if not changes:
        return CheckResult("artifacts", PASS, f"every stage's {kind} matches the baseline{note}", tolerance, measured), names
    described = "; ".join(_describe_change(c, kind) for c in (unexpected or changes))
    if unexpected:
        return CheckResult("artifacts", FAIL, f"{described}; not expected by the policy (expect_changed = {expected}){note}"
                           f"{_divergence_note(divergence)}", tolerance, measured), names
    return CheckResult("artifacts", PASS, f"{described}; expected by the policy{note}", tolerance, measured), names


def check_calibration_repeat(candidate: Side, policy: Policy) -> CheckResult:
    tolerance = {"repeat_must_agree": policy.calibration.repeat_must_agree}
    section = candidate.pipeline.sections.get("calib_repeat")
    if not policy.calibration.repeat_must_agree:
        return CheckResult("calibration.repeat", NA, "the policy does not require repeated calibration to agree", tolerance)
    if not isinstance(section, dict):
        return CheckResult("calibration.repeat", FAIL,
                           "the pipeline run has no repeated calibration; set [calibration] repeat = 2 or more", tolerance)
    try:
        repeat = RepeatResult.from_json(section)
    except QconsistError as exc:
        return CheckResult("calibration.repeat", FAIL, f"the pipeline run's repeated calibration record is damaged: {exc}", tolerance)
    md5s = repeat.md5s
    repeats = len(md5s)
    measured = {"repeats": repeats, "distinct_md5": len(set(md5s)), "md5": md5s}
    if repeat.producers is not None:
        measured["producers_varying"] = [v.tensor for v in repeat.producers.varying]
    if repeat.by_chance:  # one md5, but a calibrated tensor's producer varies between runs on this EP
        return CheckResult("calibration.repeat", FAIL, f"{repeat.verdict()} ({repeat.producers.evidence()})",  # type: ignore[union-attr]
                           tolerance, measured)
    if repeat.agree:
        return CheckResult("calibration.repeat", PASS, f"{repeats} calibrations gave identical quantized models", tolerance, measured)
    shown = ", ".join(sorted({d.tensor for d in repeat.differences})[:5])
    return CheckResult("calibration.repeat", FAIL,
                       f"{repeats} calibrations disagree ({measured['distinct_md5']} distinct md5)"
                       + (f"; differing tensors: {shown}" if shown else ""), tolerance, measured)


def _scale_problems(candidate: Side) -> list[dict[str, Any]]:
    """NaN/Inf/zero/negative scales: the pipeline's recorded issues, and a scan of the table itself."""
    calibration = candidate.pipeline.calibration
    found: dict[str, dict[str, Any]] = {}
    for issue in calibration.issues:
        if isinstance(issue, dict) and issue.get("tensor"):
            found[issue["tensor"]] = issue
    for tensor, entry in calibration.table.items():
        if not isinstance(entry, dict) or tensor in found:
            continue
        scales = entry.get("scale")
        values = scales if isinstance(scales, list) else [scales]
        numbers = [float(v) if isinstance(v, (int, float, str)) else math.nan for v in values if v is not None]
        bad = [v for v in numbers if not math.isfinite(v) or v <= 0]
        if bad:
            problem = "nan" if any(math.isnan(v) for v in bad) else "inf" if any(math.isinf(v) for v in bad) else "zero"
            found[tensor] = {"tensor": tensor, "problem": problem, "nodes": entry.get("nodes", []),
                             "scale_initializer": entry.get("scale_initializer")}
    return list(found.values())


def check_quantization_params(candidate: Side, policy: Policy) -> CheckResult:
    waived = set(policy.calibration.waive_nonfinite)
    tolerance = {"waive_nonfinite": sorted(waived)}
    problems = _scale_problems(candidate)
    blocking = [p for p in problems if p["tensor"] not in waived and p.get("scale_initializer") not in waived]
    measured = {"problems": problems, "waived": [p["tensor"] for p in problems if p not in blocking]}
    if not candidate.pipeline.calibration.table and not problems:
        return CheckResult("calibration.params", FAIL, "the pipeline run records no calibration table", tolerance, measured)
    if blocking:
        text = "; ".join(
            f"tensor '{p['tensor']}' has a {p['problem']} scale"
            + (f" ('{p['scale_initializer']}')" if p.get("scale_initializer") else "")
            + (f", consumed by {', '.join(p.get('nodes') or [])}" if p.get("nodes") else "")
            for p in blocking
        )
        return CheckResult("calibration.params", FAIL, text, tolerance, measured)
    note = f" ({len(measured['waived'])} waived by the policy: {', '.join(measured['waived'])})" if measured["waived"] else ""
    return CheckResult("calibration.params", PASS, f"every scale is finite and positive{note}", tolerance, measured)


def _compare(reference: list[dict[str, np.ndarray]], got: list[dict[str, np.ndarray]], limits: DriftLimits,
             judged: Sequence[JudgedOutput] | None = None):
    atol = limits.max_abs_diff
    return compare_outputs(reference, got, atol, 0.0 if atol is not None else None, judged)


def _drift_result(name: str, against: str, comparison: OutputComparison, limits: DriftLimits, extra: str = "",
                  blame: Callable[[dict[str, float]], dict[str, str]] | None = None) -> CheckResult:
    """The drift check's verdict: every limit on what it applies to (``max_abs_diff`` every output,
    ``min_top1_agreement`` the class-scores outputs, ``min_sqnr_db`` every output and part); ``blame`` names
    where the outputs below the SQNR floor lost their signal."""
    tolerance = {"max_abs_diff": limits.max_abs_diff, "min_top1_agreement": limits.min_top1_agreement,
                 "min_sqnr_db": limits.min_sqnr_db, "rtol": 0.0}
    pct = 100.0 * comparison.mismatched / comparison.elements if comparison.elements else 0.0
    record = comparison.to_json()
    measured = {key: record[key] for key in ("samples", "elements", "mismatched", "max_abs_diff", "max_rel_diff",
                                             "worst_output", "worst_sample", "worst_index", "top1_agreement")}
    top1 = comparison.top1_agreement
    where = (f"greatest absolute difference {comparison.max_abs_diff:.4g} at {record['worst_output']}"
             f"{record['worst_index']} of sample {record['worst_sample']}" if comparison.worst is not None
             else "the outputs are bit-identical")  # never "difference 0 at []"
    figures = where + (f", top-1 agreement {top1:.1%}" if top1 is not None else "") + f" over {comparison.samples} samples"
    if comparison.judged:
        measured["outputs"] = [j.to_json() for j in comparison.judgements]
        figures += "; " + "; ".join(j.describe() for j in comparison.judgements)
    failures = []
    if not math.isfinite(comparison.max_abs_diff):  # never passes, with or without a limit
        failures.append("a non-finite difference (NaN or Inf on one side only)")
    elif limits.max_abs_diff is not None and comparison.max_abs_diff > limits.max_abs_diff:
        failures.append(
            f"Mismatched elements: {comparison.mismatched} / {comparison.elements} ({pct:.1f}%) beyond {limits.max_abs_diff:g}"
        )
    if limits.min_top1_agreement is not None and top1 is not None and top1 < limits.min_top1_agreement:
        failures.append(f"top-1 agreement {top1:.1%} < {limits.min_top1_agreement:.1%}")
    below = comparison.below(limits.min_sqnr_db) if comparison.judged else []
    if below:
        measured["below_floor"] = [j.label for j in below]
        where = blame({j.label: j.sqnr_db for j in below}) if blame is not None else {}
        measured["losing_nodes"] = where
        failures += [f"output {j.label} ({j.target.kind_name}) "
                     + (f"{sqnr_phrase(j.sqnr_db)} < {limits.min_sqnr_db:g} dB" if j.figure != ZERO_SIGNAL else
                        f"{sqnr_phrase(None, ZERO_SIGNAL)}, greatest difference {j.noise.max_abs:.4g}: no SQNR to reach "
                        f"{limits.min_sqnr_db:g} dB")
                     + (f" ({where[j.label]})" if where.get(j.label) else "") for j in below]
    if failures:
        return CheckResult(name, FAIL, f"against {against}: {'; '.join(failures)}; {figures}{extra}", tolerance, measured)
    return CheckResult(name, PASS, f"against {against}: {figures}{extra}", tolerance, measured)


def check_drift_float(candidate: Side, policy: Policy) -> CheckResult:
    float_stage = candidate.float_stage()
    if float_stage is None or candidate.stage("quantize") is None:
        return CheckResult("drift.float", FAIL, "the run has no float and quantized artifacts to compare")
    reference = candidate.outputs(float_stage)
    got = candidate.outputs("quantize")
    judged = candidate.judged()
    return _drift_result("drift.float", f"the float model ({float_stage} stage)",
                         _compare(reference, got, policy.drift.float, judged), policy.drift.float,
                         blame=lambda failing: losing_nodes(candidate, failing, judged, policy.drift.float.min_sqnr_db or 0.0))


def check_drift_baseline(candidate: Side, baseline: Side | None, policy: Policy, divergence: dict[str, Any] | None) -> CheckResult:
    limits = policy.drift.baseline
    if baseline is None:
        return CheckResult("drift.baseline", NA, "no baseline: nothing to compare the final outputs with",
                           {"max_abs_diff": limits.max_abs_diff, "min_top1_agreement": limits.min_top1_agreement,
                            "min_sqnr_db": limits.min_sqnr_db})
    if same_role_inputs(candidate, baseline, "evaluation") is False:
        return CheckResult("drift.baseline", FAIL,
                           "the evaluation inputs differ from the baseline's (input digests differ); outputs are not comparable")
    extra = _divergence_note(divergence)
    if not extra and divergence and divergence.get("identical"):
        extra = "; every dumped tensor is bit-identical to the baseline's"
    elif not extra and divergence and divergence.get("unavailable"):
        extra = f"; first diverging node unknown ({divergence['unavailable']})"
    comparison = _compare(baseline.outputs("quantize"), candidate.outputs("quantize"), limits, candidate.judged())
    return _drift_result("drift.baseline", f"the baseline {baseline.path.name}", comparison, limits, extra)


def check_inference_repeat(candidate: Side, policy: Policy, repeat_divergence: dict[str, Any] | None) -> CheckResult:
    tolerance = {"repeat_must_be_identical": policy.inference.repeat_must_be_identical}
    if not policy.inference.repeat_must_be_identical:
        return CheckResult("inference.repeat", NA, "the policy does not require repeated inference to be identical", tolerance)
    if repeat_divergence is not None and not repeat_divergence.get("unavailable"):
        if repeat_divergence.get("identical"):
            return CheckResult("inference.repeat", PASS,
                               f"two dumped inferences are bit-identical in all {repeat_divergence.get('tensors', '?')} tensors",
                               tolerance, repeat_divergence)
        return CheckResult("inference.repeat", FAIL,
                           f"two inferences of the same model differ; first diverging node {repeat_divergence.get('first_diverging_node')}",
                           tolerance, repeat_divergence)

    first = candidate.outputs("quantize")
    second = outputs_of(candidate.artifact("quantize"), evaluation_inputs(candidate))
    differing = [
        (index, name) for index, (a, b) in enumerate(zip(first, second)) for name in a
        if a[name].tobytes() != b[name].tobytes()
    ]
    measured = {"samples": len(first), "differing": [f"sample {i} {n}" for i, n in differing[:10]]}
    if differing:
        return CheckResult("inference.repeat", FAIL,
                           f"two fresh sessions gave different final outputs in {len(differing)} sample output(s)", tolerance, measured)
    return CheckResult("inference.repeat", PASS, f"two fresh sessions gave bit-identical final outputs on {len(first)} samples",
                       tolerance, measured)


def check_output_finite(candidate: Side, policy: Policy) -> CheckResult:
    tolerance = {"allow_nonfinite_outputs": policy.inference.allow_nonfinite_outputs}
    bad = []
    for index, sample in enumerate(candidate.outputs("quantize")):
        for name, value in sample.items():
            if np.issubdtype(value.dtype, np.floating):
                nan, inf = int(np.isnan(value).sum()), int(np.isinf(value).sum())
                if nan or inf:
                    bad.append({"sample": index, "output": name, "nan": nan, "inf": inf})
    measured = {"nonfinite": bad}
    if bad and not policy.inference.allow_nonfinite_outputs:
        first = bad[0]
        return CheckResult("outputs.finite", FAIL,
                           f"{len(bad)} output(s) hold NaN or Inf, first {first['output']} of sample {first['sample']} "
                           f"({first['nan']} NaN, {first['inf']} Inf)", tolerance, measured)
    return CheckResult("outputs.finite", PASS, "no NaN or Inf in the quantized model's final outputs"
                       if not bad else f"{len(bad)} output(s) hold NaN or Inf (allowed by the policy)", tolerance, measured)


def _accuracy(candidate: Side) -> tuple[Accuracy | None, str]:
    """The quantized model's accuracy on the evaluation set: as the nightly's quantized inference run recorded it
    (the figure the history keeps), else computed here the same way (``qconsist.compare.accuracy``); or why none."""
    if "quantized" in candidate.inference:
        recorded = Run.open(candidate.inference["quantized"]).inference
        if recorded.accuracy is not None:
            return recorded.accuracy, ""
    names = evaluation_inputs(candidate).names
    outputs = candidate.outputs("quantize")
    target = class_scores_output(candidate.judged(), "labels")
    counter = AccuracyCounter(target.output)
    samples = [np.asarray(target.select(out[target.output])) for out in outputs]
    if samples:
        counter.add(np.stack(samples), labels_array([candidate.labels.get(n) for n in names]))
    return counter.result(), counter.problem


def check_labels(candidate: Side, policy: Policy) -> CheckResult:
    tolerance = {"min_accuracy": policy.labels.min_accuracy}
    if not candidate.labels:
        return CheckResult("labels.accuracy", NA, "the evaluation inputs have no labels", tolerance)
    found, problem = _accuracy(candidate)
    if found is None:
        return CheckResult("labels.accuracy", FAIL, problem or "no evaluation sample has a label (label names do not match)", tolerance)
    accuracy = found.top1_share or 0.0
    measured = {"accuracy": accuracy, "labelled": found.labelled, "correct": found.top1, "output": found.output,
                "top5": found.top5_share}
    status = PASS if accuracy >= policy.labels.min_accuracy else FAIL
    return CheckResult("labels.accuracy", status,
                       f"top-1 accuracy of {found.output} {accuracy:.1%} ({found.top1}/{found.labelled}) against minimum "
                       f"{policy.labels.min_accuracy:.1%}", tolerance, measured)


def recommended_gpu_config(locate: Run) -> str | None:
    """The recommended config label of a locate run (its manifest's locate section)."""
    recommendation = locate.locate.recommendation
    return recommendation.get("config") if isinstance(recommendation, dict) else None


_PHASES = {"run-to-run": "between runs of one session", "quiet": "between fresh sessions",
           "contention": "between sessions under GPU contention"}


def _configs(report: LocateReport, want: GpuConfig) -> list[ConfigReport]:
    return [c for c in report.configs if GpuConfig.parse(c.label).resolved() == want]


def _varying_nodes(report: LocateReport, want: GpuConfig) -> str:
    """The nodes that varied under a config in a locate report, and how: "node upscore (ConvTranspose) vary
    between runs of one session; ..."."""
    ops = {n.label: n.op_type for n in report.nodes}
    found = []
    for config in _configs(report, want):
        for outcome in config.repeats:
            if not outcome.stable and outcome.origins:
                named = ", ".join(f"{o} ({ops[o]})" if ops.get(o) else o for o in outcome.origins)
                found.append(f"node(s) {named} vary {_PHASES.get(outcome.phase, outcome.phase)}")
    return "; ".join(found)


def _acceptable_pin(report: LocateReport, pinned: str) -> tuple[bool, str]:
    """A pinned config is acceptable when locate found it bit-stable and within the report's accepted cost of the
    fastest configuration, by the one rule of locate's recommendation (``acceptance``): where the report has the
    configurations' times per round (timed side by side), the median of the pin's paired ratios to the fastest;
    in an older report, the ratio of the medians (the message says which). Latency medians of configs that are
    equally fast move from run to run, so demanding the one fastest config would make the verdict flip with
    timing noise."""

    rec = report.recommendation
    want = GpuConfig.parse(pinned).resolved()
    if rec is None or not any(GpuConfig.parse(c).resolved() == want for c in rec.stable_configs):
        varied = _varying_nodes(report, want)
        if varied:
            return False, f"under the pinned {pinned} the locate report saw {varied}"
        return False, f"pinned {pinned} was not bit-stable across fresh sessions (or not measured) in the locate report"
    quickest = report.fastest_latency
    for config in _configs(report, want)[:1]:
        if config.latency is None or not rec.fastest_ms:
            break
        accepted, why = acceptance(config.latency.median_ms, rec.fastest_ms, rec.max_cost, str(rec.fastest),
                                   config.latency.p25_ms, quickest.p75_ms if quickest is not None else None,
                                   report.paired(config.latency))
        return accepted, why if accepted else f"pinned {pinned} is bit-stable but {why}"
    return False, f"the locate report has no latency for pinned {pinned}"


def check_gpu(candidate: Side, policy: Policy) -> CheckResult:
    tolerance = {"require_pinned": policy.gpu.require_pinned}
    if candidate.locate_path is None:
        reason = candidate.locate_skipped or "no locate report for this run"
        return CheckResult("gpu.pinned", NA, f"no GPU recommendation to enforce: {reason}", tolerance)

    recommended = recommended_gpu_config(Run.open(candidate.locate_path))
    measured = {"recommended": recommended, "pinned": candidate.pinned_gpu}
    if recommended is None:
        return CheckResult("gpu.pinned", NA, "the locate report recommends no configuration (none was bit-stable)", tolerance, measured)
    if not policy.gpu.require_pinned:
        return CheckResult("gpu.pinned", NA, f"locate recommends {recommended}; the policy does not require pinning it", tolerance, measured)
    if candidate.pinned_gpu is None:
        return CheckResult("gpu.pinned", FAIL, f"locate recommends {recommended} but the model pins no GPU config; set gpu_config = \"{recommended}\"",
                           tolerance, measured)
    try:
        accepted, why = _acceptable_pin(load_report(candidate.locate_path), candidate.pinned_gpu)
    except QconsistError as exc:
        return CheckResult("gpu.pinned", FAIL, f"pinned GPU config is invalid: {exc}", tolerance, measured)
    if not accepted:
        return CheckResult("gpu.pinned", FAIL, f"{why}; locate recommends {recommended}", tolerance, measured)
    rewritten = _rewritten_nodes(candidate)
    if rewritten:
        measured["rewritten"] = rewritten
    fixed = f"; the determinize stage rewrote {', '.join(rewritten)}" if rewritten else ""
    return CheckResult("gpu.pinned", PASS, f"pins {candidate.pinned_gpu}: bit-stable, {why}{fixed}", tolerance, measured)


def _rewritten_nodes(side: Side) -> list[str]:
    """The nodes the candidate's pipeline rewrote into deterministic forms (its determinize stage)."""
    record = side.stage("determinize") or {}
    params = record.get("params") if isinstance(record, dict) else None
    names = params.get("rewritten") if isinstance(params, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else []


def check_environment(candidate: Side, baseline: Side | None, policy: Policy) -> CheckResult:
    """The candidate ran with the same onnxruntime, onnx, numpy, CUDA, cuDNN, driver, GPU and numerics
    variables as its baseline: a difference there is a common, real cause of other results, so it fails the
    gate unless the policy accepts it (``[environment] allow_changed``)."""

    tolerance = {"allow_changed": list(policy.environment.allow_changed)}
    if baseline is None:
        return CheckResult("environment", NA, "no baseline: no environment to compare with", tolerance)
    diff = compare_environments(baseline.pipeline.manifest.environment, candidate.pipeline.manifest.environment)
    measured = {"changed": to_jsonable(diff.numerics)}
    if not diff.numerics:
        return CheckResult("environment", PASS, "same onnxruntime, onnx, numpy, CUDA/cuDNN, driver, GPU and numerics "
                           "variables as the baseline", tolerance, measured)
    refused = [c for c in diff.numerics if c.name not in policy.environment.allow_changed]
    listed = "; ".join(str(c) for c in diff.numerics)
    if refused:
        return CheckResult("environment", FAIL, f"the baseline ran in another environment ({listed}): results may "
                           f"differ for that reason alone; compare like with like, or accept it with [environment] "
                           f"allow_changed = [{', '.join(repr(c.name) for c in refused)}]", tolerance, measured)
    return CheckResult("environment", PASS, f"environment differs from the baseline as the policy accepts ({listed})",
                       tolerance, measured)
