"""The page of one pipeline or inference run: which run, its verdict, its checks with their figures (SQNR of each
output against the float model), its artifacts and repeated calibration; an inference run's model, inputs,
execution options and dump. Several runs on one page (``report runA runB``) each get their own section, headed
by their run id, so the page says which is which."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from qconsist.calibration.repeat import RepeatResult
from qconsist.report.html import artifacts_section, banner

PASSED, FAILED, RECORDED = "pass", "fail", "not_applicable"


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "—"}[value]
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    return escape(str(value))


def _judged(entry: dict[str, Any]) -> str:
    if entry.get("integer"):
        return f"{entry.get('identical_samples')}/{entry.get('samples')} samples identical (integers)"
    text = f"SQNR {float(entry['sqnr_db']):.1f} dB, cosine {float(entry['cosine']):.5f}"
    if entry.get("top1_agreement") is not None:
        text += f", top-1 agreement {entry['top1_agreement']:.0%}"
    return text


def checks(stages: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """Every check of a pipeline run's stages: (stage, check, status, detail)."""
    rows: list[tuple[str, str, str, str]] = []
    for stage in stages:
        name = str(stage.get("name"))
        for key, check in (stage.get("checks") or {}).items():
            if check in ("passed", "failed"):
                rows.append((name, key.replace("_", " "), PASSED if check == "passed" else FAILED, ""))
            elif isinstance(check, dict) and key.startswith("outputs_vs_"):
                against = key[len("outputs_vs_"):]
                if check.get("atol") is not None:
                    rows.append((name, f"outputs vs {against}", PASSED if check.get("passed") else FAILED,
                                 f"greatest abs difference {_number(check.get('max_abs_diff'))} within atol "
                                 f"{_number(check['atol'])} + rtol {_number(check.get('rtol'))}·|a| on "
                                 f"{check.get('samples')} evaluation inputs"))
                elif check.get("judged") is not None:
                    floor = check.get("min_sqnr_db")
                    status = RECORDED if floor is None else (FAILED if check.get("below_floor") else PASSED)
                    outputs = "; ".join(f"{escape(str(j.get('label')))} ({escape(str(j.get('kind') or 'undeclared'))}): "
                                        f"{_judged(j)}" for j in check["judged"])
                    rows.append((name, f"outputs vs {against}" + (f", floor {floor:g} dB SQNR" if floor is not None else ""),
                                 status, f"{outputs} on {check.get('samples')} evaluation inputs"))
                else:
                    rows.append((name, f"outputs vs {against}", RECORDED,
                                 f"greatest abs difference {_number(check.get('max_abs_diff'))}, top-1 agreement "
                                 f"{_number(check.get('top1_agreement'))} on {check.get('samples')} evaluation inputs"))
            elif isinstance(check, dict) and key == "instruction_sets" and isinstance(check.get("passed"), bool):
                rows.append((name, "across instruction sets" + (" (pinned)" if check.get("pinned") else ""),
                             PASSED if check["passed"] else FAILED, escape("; ".join(str(x) for x in check.get("lines") or ()))))
            elif isinstance(check, dict) and key == "caffe_reference" and "passed" in check:
                rows.append((name, "vs the Caffe reference", PASSED if check.get("passed") else FAILED,
                             f"greatest abs difference {_number(check.get('max_abs'))} within {_number(check.get('tolerance'))} "
                             "against the numpy Caffe reference on a seeded input"))
    return rows


def _checks_table(rows: list[tuple[str, str, str, str]]) -> str:
    if not rows:
        return '<h2>Checks</h2><p class="muted">This run records no checks.</p>'
    words = {PASSED: "passed", FAILED: "FAILED", RECORDED: "recorded"}
    body = "".join(f"<tr><td>{escape(stage)}</td><td>{escape(check)}</td><td class=\"status-{status}\">{words[status]}</td>"
                   f"<td>{detail}</td></tr>" for stage, check, status, detail in rows)
    return ("<h2>Checks</h2><table><tr><th>stage</th><th>check</th><th>status</th><th>figures</th></tr>" + body + "</table>")


def _facts(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _inputs(inputs: dict[str, Any]) -> str:
    if not isinstance(inputs, dict) or not inputs:
        return "—"
    text = f"<code>{escape(str(inputs.get('source', '?')))}</code>"
    if inputs.get("count") is not None:
        text += f", {inputs.get('count')} samples from {inputs.get('offset', 0)}"
    return text


def pipeline_parts(run: Any) -> list[str]:  # Run
    """A pipeline run: verdict banner, what ran, checks, artifacts, repeated calibration."""
    manifest = run.manifest
    rows = checks(run.stages)
    repeat_data = manifest.sections.get("calib_repeat")
    repeat = RepeatResult.from_json(repeat_data) if isinstance(repeat_data, dict) else None
    failed = [f"{stage} {check}" for stage, check, status, _ in rows if status == FAILED]
    if repeat is not None and not repeat.passed:
        failed.append("repeated calibration")
    judged = sum(1 for row in rows if row[2] != RECORDED)
    state = "fail" if failed else "pass"
    title = f"{'FAIL' if failed else 'PASS'} — pipeline run {manifest.run_id}"
    subtitle = (f"model {run.name}: " + (f"failed: {', '.join(failed)}" if failed else
                                         f"{judged} checks passed" + (f", {len(repeat.runs)} calibrations agree" if repeat else "")))
    sqnr = [j for stage in run.stages for check in (stage.get("checks") or {}).values()
            if isinstance(check, dict) for j in (check.get("judged") or []) if not j.get("integer")]
    facts = [("run", f"<code>{escape(str(run.path))}</code>"), ("model", escape(run.name)),
             ("started", escape(str(manifest.started or "?"))),
             ("calibration inputs", _inputs(manifest.inputs.get("calibration"))),
             ("evaluation inputs", _inputs(manifest.inputs.get("evaluation")) if "same_as" not in (manifest.inputs.get("evaluation") or {})
              else "the calibration inputs")]
    if sqnr:
        facts.append(("SQNR vs the float model", "; ".join(
            f"{escape(str(j.get('label')))} {float(j['sqnr_db']):.1f} dB" for j in sqnr)))
    body = [banner(state, title, subtitle), "<main>", _facts(facts), _checks_table(rows), artifacts_section(run.stages)]
    if repeat is not None:
        body.append(f"<h2>Repeated calibration</h2><p>{escape(repeat.verdict())}</p>")
        if repeat.differences:
            body.append("<ul>" + "".join(f"<li>{escape(d.line())}</li>" for d in repeat.differences) + "</ul>")
    else:
        body.append('<h2>Repeated calibration</h2><p class="muted">Not run ([calibration] repeat = 1).</p>')
    body.append("</main>")
    return body


def inference_parts(run: Any) -> list[str]:  # Run
    """An inference run: which model (the source run and stage), inputs, execution options, dump, accuracy."""
    manifest = run.manifest
    section = run.inference if run.has_inference else None
    model = manifest.model
    source = f"<code>{escape(str(model.get('run') or model.get('path') or '?'))}</code>"
    if model.get("stage"):
        source += f", stage {escape(str(model['stage']))}"
    options = (section.options if section is not None else {}) or {}
    shown = [f"{k} {escape(str(v))}" for k, v in (("provider", options.get("provider")),
                                                   ("level", options.get("graph_optimization_level")),
                                                   ("intra-op threads", options.get("intra_op_threads")))
             if v is not None]
    if options.get("provider_options"):
        shown.append("provider options " + escape(", ".join(f"{k}={v}" for k, v in options["provider_options"].items())))
    if options.get("disabled_optimizers"):
        shown.append("disabled " + escape(", ".join(options["disabled_optimizers"])))
    facts = [("run", f"<code>{escape(str(run.path))}</code>"), ("model", source),
             ("inputs", _inputs(manifest.inputs)), ("execution", "; ".join(shown) or "onnxruntime's defaults")]
    if section is not None:
        facts.append(("samples", f"{section.samples} (batch {section.batch_size}), {section.ms_per_sample:.1f} ms per sample"))
    state, verdict = "neutral", "recorded"
    if run.has_dump:
        dump = run.dump
        faithful = getattr(dump, "faithful", None)
        facts.append(("dump", f"{getattr(dump, 'tensors', '?')} tensors fingerprinted; "
                      + ("faithful: final outputs bit-identical to production" if faithful else
                         "NOT faithful: final outputs differ from production")))
        state, verdict = ("pass", "dump faithful") if faithful else ("fail", "dump NOT faithful")
    if section is not None and section.accuracy is not None:
        facts.append(("accuracy", escape(section.accuracy.describe())))
    title = f"inference run {manifest.run_id}"
    return [banner(state, title, f"{run.name}: {verdict}"), "<main>", _facts(facts), "</main>"]
