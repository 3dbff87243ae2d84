"""HTML reports: one self-contained file per run, diff and nightly (``qconsist report``)."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any, Sequence

import os

from qconsist.calibration.repeat import RepeatResult
from qconsist.diff import DiffResult
from qconsist.diff.runs import SCHEMA as DIFF_SCHEMA
from qconsist.errors import InputError, QconsistError, RunStoreError
from qconsist.report.explorer import explorer_overlay
from qconsist.store.serde import loads
from qconsist.report.history import history_link, render_history, write_history_page
from qconsist.report.html import (
    artifacts_section, banner, divergence_section, entry_body, gpu_section, page, verdict_state, write_report,
)
from qconsist.locate.report import LocateReport
from qconsist.locate.run import load_report
from qconsist.report.run_page import inference_parts, pipeline_parts
from qconsist.report.sensitivity import sensitivity_section
from qconsist.report.sensitivity import state as sensitivity_state
from qconsist.report.sensitivity import title as sensitivity_title
from qconsist.sensitivity import SCHEMA as SENSITIVITY_SCHEMA
from qconsist.sensitivity import SensitivityResult
from qconsist.sensitivity.analysis import load_sensitivity
from qconsist.store.confine import linked_run
from qconsist.store.run import Run

__all__ = ["render_entry_report", "render_history", "render_nightly_report", "render_paths", "write_history_page", "write_report"]


def _locate_section(path: Path | None) -> LocateReport | None:
    """The locate report of a locate run (verified); ``None`` when that run is gone."""
    if path is None or not path.is_dir():
        return None
    return load_report(path)


def _verified(run: Run) -> None:
    """The artifacts whose hashes the report shows are checked against them (a nightly entry's are its
    pipeline run's)."""
    if run.kind == "nightly-entry":
        entry = run.sections.get("nightly_entry") or {}
        if isinstance(entry, dict) and entry.get("pipeline_run"):
            pipeline = linked_run(run.path, entry["pipeline_run"], "pipeline run")
            if pipeline.is_dir():
                Run.open(pipeline).verify_artifacts()
        return
    run.verify_artifacts()


def _entry_parts(run: Run, heading: str = "h1") -> tuple[str, list[str]]:
    entry = run.sections.get("nightly_entry", {})
    if not isinstance(entry, dict):
        raise RunStoreError(f"run {run.path}: the manifest's nightly_entry section must be an object")
    _verified(run)
    verdict = run.sections.get("gate")
    locate_run = entry.get("locate_run")
    locate = _locate_section(linked_run(run.path, locate_run, "locate run")) if locate_run else None
    name = str(entry.get("model") or run.manifest.model.get("name"))
    body = entry_body(name, run.stages, verdict, locate, entry.get("locate_skipped"), heading)
    return name, body + _entry_sensitivity(run.path, entry.get("sensitivity"))


def _entry_sensitivity(path: Path, found: Any) -> list[str]:
    """The entry's candidate fix (its sensitivity run), or why there is none."""
    if not isinstance(found, dict):
        return []
    if found.get("error"):
        return ["<h2>Sensitivity: which nodes to keep in float</h2>",
                f'<p class="reasons">Not made: {_esc(found["error"])}</p>']
    run = linked_run(path, found["run"], "sensitivity run") if found.get("run") else None
    if run is None or not run.is_dir():
        return ["<h2>Sensitivity: which nodes to keep in float</h2>", '<p class="muted">Its run directory is gone.</p>']
    return sensitivity_section(load_sensitivity(run))


def _title(name: str, verdict: dict[str, Any] | None) -> tuple[str, str]:
    if verdict is None:
        return "neutral", f"{name}: no verdict"
    word = "PASS" if verdict.get("passed") else "FAIL"
    return verdict_state(verdict), f"{word} — {name}"


def render_entry_report(run: Run, side: Any = None) -> str:
    """One model's night: verdict, artifacts, divergence against the baseline, origin nodes, GPU matrix."""
    name, body = _entry_parts(run)
    state, title = _title(name, run.sections.get("gate"))
    reasons = (run.sections.get("gate") or {}).get("reasons") or []
    return page(f"qconsist {name}", [banner(state, title, f"{len(reasons)} reason(s) to fail" if reasons else "all checks passed"),
                                     "<main>", *body, "</main>"])


def handout_text(handout: dict) -> str:
    """The sentence that says in which order a night handed its tasks out and why (``qconsist.nightly.order.HandOut``
    as its JSON: ``rule``, ``order``, ``reason``, ``durations``); the CLI and the night's page both say it."""
    if handout.get("rule") != "longest-first":
        reason = handout.get("reason")
        return f"handed out in the file's order ({reason})" if reason else "handed out in the file's order"
    durations = handout.get("durations") or {}
    said = [f"{key} {durations[key]:.1f} s" if durations.get(key) is not None else f"{key} (no duration yet)"
            for key in handout.get("order") or []]
    return f"handed out longest first, by each entry's last duration: {', '.join(said)}"


def render_nightly_report(result: Any, history_page: str | None = None) -> str:
    """A night: the summary table, then every model's section; ``history_page``: the link to the history page."""
    data = result.to_json() if hasattr(result, "to_json") else result
    entries = data["entries"]
    summary = data.get("summary") or {}
    state = "error" if summary.get("error") else ("pass" if data.get("passed") else "fail")
    title = f"Nightly {data['night_id']}: {summary.get('pass', 0)} pass, {summary.get('fail', 0)} fail, {summary.get('error', 0)} error"
    rows = []
    for entry in entries:
        verdict = entry.get("verdict") or {}
        failed = [c.get("name") for c in verdict.get("checks") or [] if c.get("status") == "fail"]
        # each reason is said once, in the model's section: here the checks that failed, linked to it
        detail = (_esc(entry["error"]) if entry.get("error") else
                  f"{len(failed)} check(s) failed: " + ", ".join(f"<b>{_esc(name)}</b>" for name in failed)
                  + f' (<a href="#model-{_esc(entry["model"])}">reasons</a>)' if failed else
                  _esc("; ".join(verdict.get("reasons") or []) or "all checks passed"))
        rows.append(f"<tr><td><a href=\"#model-{entry['model']}\">{entry['model']}</a></td>"
                    f"<td class=\"status-{'pass' if entry['status'] == 'pass' else 'fail'}\">{entry['status']}</td>"
                    f"<td>{_esc(entry.get('gpu_label') or '—')}</td>"
                    f"<td>{_esc(_devices(entry.get('devices')))}</td>"
                    f"<td>{detail}</td><td>{_esc(verdict.get('first_diverging_node') or '—')}</td>"
                    f"<td>{entry.get('seconds', 0):.1f}</td></tr>")
    history = (f'<p class="history-link">Every night of these models, at a glance: <a href="{_esc(history_page)}">the history '
               "page</a> (hashes, verdicts, figures and what changed first, by model and GPU type).</p>") if history_page else ""
    body = [banner(state, title, f"config {data.get('config')}"), "<main>", history, "<h2>Summary</h2>",
            "<table><tr><th>model</th><th>status</th><th>GPU type</th><th>GPU</th><th>reasons</th><th>first diverging node</th><th>seconds</th></tr>"
            + "".join(rows) + "</table>"]
    if data.get("seconds"):
        body.append(f'<p class="muted">Wall time of the night: {data["seconds"]:.1f} s ({data.get("executor", "local")} executor; '
                    f'the entries together: {sum(e.get("seconds", 0) for e in entries):.1f} s).</p>')
    handout = data.get("handout") or {}
    if len(handout.get("order") or []) > 1:  # the order the tasks were handed out in, and the durations it used
        body.append(f'<p class="muted">{_esc(handout_text(handout))}.</p>')
    retries = data.get("retries") or {}
    if retries:
        body.append("<h2>Retries</h2><p>Entries whose worker was lost, run again; each lost attempt's run directory is "
                    "left incomplete.</p><ul>" + "".join(
                        f"<li><code>{_esc(model)}</code>: {_esc('; '.join(reasons))}</li>" for model, reasons in retries.items()) + "</ul>")
    across = data.get("across_gpus") or []
    if across:
        rows = "".join(
            f"<tr><td>{_esc(c['model'])}</td><td>{_esc(c['gpu_a'])} vs {_esc(c['gpu_b'])}</td>"
            f"<td>{'CUDA EP' if c['role'] == 'gpu' else 'CPU EP'}</td>"
            f"<td class=\"status-{'pass' if c['identical'] and not c.get('run_to_run') else 'fail'}\">{_esc(_across_result(c))}</td>"
            f"<td>{_esc(_found(c))}</td>"
            f"<td>{_esc(', '.join(c['nodes']) or '—')}</td></tr>" for c in across)
        body.append("<h2>Across GPU types</h2><p>The same model's dumps on each GPU type against the first type's, and on "
                    "each device of an entry with <code>devices</code> against its first device's, under the entry's pinned "
                    "GPU config: the nodes listed differ between them. Each GPU dumps the model twice, in fresh sessions: a node that "
                    "differs between its two sessions on one GPU varies from run to run there (not blamed on the GPU); an origin "
                    "(or span) of the difference that is stable on each GPU depends on the GPU. (Nights recorded before the second "
                    "dumps had one dump on each: a node that varies from run to run differs there too.)</p><table><tr><th>model</th><th>GPU types or devices</th>"
                    "<th>dumps</th><th>result</th><th>origins and spans</th><th>nodes that differ</th></tr>" + rows + "</table>")
    for entry in entries:
        if entry.get("entry_run"):
            path = Path(entry["entry_run"])  # the night's own record, written by this qconsist
            try:
                run = Run.open(path)
            except RunStoreError as exc:
                body.append(f"<h2 id=\"model-{entry['model']}\">{entry['model']}</h2><p>{_esc(exc.message)}</p>")
                continue
            body += _entry_parts(run, heading="h2")[1]
        else:
            body.append(f"<h2 id=\"model-{entry['model']}\">{entry['model']}</h2><p class=\"reasons\">error: {_esc(entry.get('error'))}</p>")
    body.append("</main>")
    return page(f"qconsist nightly {data['night_id']}", body)


def _devices(devices: Any) -> str:
    """The GPU(s) an entry ran on: host index and UUID (``—`` without a GPU)."""
    return ", ".join(f"GPU {d.get('host_index')} ({d.get('uuid')})" for d in devices or []) or "—"


def _found(comparison: dict[str, Any]) -> str:
    inside = comparison.get("span_nodes") or []
    spans = [f"{span} (inside: {', '.join(inside[i])})" if i < len(inside) and inside[i] else span
             for i, span in enumerate(comparison.get("spans") or [])]
    parts = ([f"origins: {', '.join(comparison['origins'])}"] if comparison.get("origins") else []) + (
        [f"spans: {', '.join(spans)}"] if spans else [])
    return "; ".join(parts) or "—"


def _across_result(comparison: dict[str, Any]) -> str:
    if comparison.get("error"):
        return f"not compared: {comparison['error']}"
    varying = comparison.get("run_to_run") or []
    if comparison["identical"]:
        return f"identical, but {len(varying)} node(s) vary from run to run: {', '.join(varying)}" if varying else "identical"
    head = f"{len(comparison['nodes'])} node(s) differ, first {comparison.get('first')}"
    if not comparison.get("repeats"):  # recorded before the second dumps
        return head
    if comparison.get("unknown"):
        return f"{head}; device or run to run: unknown ({comparison['unknown']})"
    blamed = [*(comparison.get("device_origins") or []), *(comparison.get("device_spans") or [])]
    return (head + (f"; depend on the GPU: {', '.join(blamed)}" if blamed else "; none shown to depend on the GPU")
            + (f"; vary from run to run: {', '.join(varying)}" if varying else ""))


def _esc(text: Any) -> str:
    return escape(str(text))


def explorer_section(diff: dict[str, Any], folder: Path | None, relative_to: Path | None) -> str:
    """The diff's per-node divergence written as Model Explorer node data into ``folder``, and how to open it."""
    if folder is None or not diff.get("tensors"):
        return ""
    try:
        overlay = explorer_overlay(DiffResult.from_json(diff))
    except QconsistError as exc:
        return f'<h2>On the graph</h2><p class="muted">No Model Explorer overlay: {_esc(exc.message)}</p>'
    paths = overlay.write(folder)
    base = relative_to or folder
    links = ", ".join(f'<a href="{_esc(os.path.relpath(p, base))}">{_esc(p.stem)}</a>' for p in paths)
    command = (f"model-explorer {overlay.model} --extensions model_explorer_onnx --node_data_paths "
               + ",".join(str(p.resolve()) for p in paths))
    return ("<h2>On the graph</h2><p>The divergence of every node as Google Model Explorer node data "
            f"({overlay.nodes} nodes of graph <code>{_esc(overlay.graph_id)}</code>): {links}. Open the model with it "
            "(<code>pip install ai-edge-model-explorer model-explorer-onnx</code>, or qconsist's <code>explorer</code> "
            f"extra):</p><p><code>{_esc(command)}</code></p>")


def _diff_subject(diff: dict[str, Any]) -> str:
    """Which runs the diff compared, and what differed between them (options, batch) as the diff recorded it."""
    a, b = Path(str(diff.get("run_a") or "A")).name, Path(str(diff.get("run_b") or "B")).name
    differed = [str(line).replace("'", "").replace(" -> ", " → ") for line in diff.get("options") or []]
    return f"A {a} vs B {b}" + (f" — differing in {'; '.join(differed)}" if differed else "")


def _final_outputs(final: dict[str, Any]) -> str:
    """The final outputs' comparison in words and formatted figures (no raw field names)."""
    samples = final.get("samples")
    differing = final.get("differing_samples") or []
    greatest = final.get("greatest_abs")
    rows = [("samples compared", str(samples)),
            ("samples whose outputs differ", f"{len(differing)}" + (f" ({', '.join(map(str, differing[:12]))}"
                                                                    + (", …" if len(differing) > 12 else "") + ")" if differing else "")),
            ("greatest |difference|", f"{float(greatest):.4g}" if isinstance(greatest, (int, float)) else "—"),
            ("top-1 agreement", f"{final.get('top1_agree')}/{samples} ({100 * float(final.get('top1_agreement') or 0):.1f}%)"
             if final.get("top1_agreement") is not None else "—"),
            ("bit-identical", "yes" if final.get("identical") else "no")]
    return "<h2>Final outputs</h2><table>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _diff_parts(diff: dict[str, Any], label: str, explorer: str = "") -> list[str]:
    stage = (diff.get("artifacts") or {}).get("first_differing_stage")
    first = (diff.get("tensors") or {}).get("first")
    identical = bool(diff.get("passed"))
    runs = [f"<tr><th>{side}</th><td><code>{_esc(diff.get(key) or '?')}</code></td></tr>"
            for side, key in (("run A", "run_a"), ("run B", "run_b"))]
    differed = [f"<li><code>{_esc(line)}</code></li>" for line in diff.get("options") or []]
    parts = [banner("pass" if identical else "fail", f"{'PASS' if identical else 'FAIL'} — diff {_diff_subject(diff)}: "
                    + ("identical" if identical else "diverged"),
                    f"first changed stage: {stage or 'none'}; first diverging node: {first or 'none'} ({label})"), "<main>",
             "<table>" + "".join(runs) + "</table>",
             ("<p>What differed between the runs' options:</p><ul>" + "".join(differed) + "</ul>") if differed else
             '<p class="muted">The runs recorded the same execution options.</p>']
    final = diff.get("outputs") or {}
    if final:
        parts.append(_final_outputs(final))
    parts.append(divergence_section(diff))
    if explorer:
        parts.append(explorer)
    parts.append("</main>")
    return parts


def _run_parts(path: Path, relative_to: Path | None = None) -> tuple[str, list[str]]:
    run = Run.open(path)
    manifest = run.manifest
    if run.kind == "nightly-entry":
        name, body = _entry_parts(run)
        state, title = _title(name, run.sections.get("gate"))
        return name, [banner(state, title), "<main>", *body, "</main>"]
    if run.kind == "nightly":
        data = dict(run.sections.get("nightly") or {})
        entries = data.get("entries")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise RunStoreError(f"run {path}: the manifest's nightly.entries must be a list of objects")
        # the entries' runs are siblings in the night's runs directory, never elsewhere
        data["entries"] = [{**e, "entry_run": str(linked_run(path, e["entry_run"], "entry run"))} if e.get("entry_run") else e
                           for e in entries]
        html = render_nightly_report(data, history_link(data.get("history"), relative_to or path))
        return str(data.get("night_id")), [html[html.index("<body>") + 6: html.rindex("</body>")]]
    if run.kind == "sensitivity":
        result = load_sensitivity(path, manifest)
        return result.model, [banner(sensitivity_state(result), sensitivity_title(result), f"sensitivity run {manifest.run_id}"),
                              "<main>", *sensitivity_section(result), artifacts_section(run.stages, title="Verified model"),
                              "</main>"]
    _verified(run)
    name = run.name
    if run.kind == "pipeline":
        return name, pipeline_parts(run)
    if run.kind == "inference":
        return name, inference_parts(run)
    body = [banner("neutral", f"{manifest.kind} run {manifest.run_id}", name), "<main>",
            artifacts_section(run.stages)]
    if run.kind == "inference" and run.inference.accuracy is not None:
        body.append(f"<h2>Accuracy</h2><p>{_esc(run.inference.accuracy.describe())}</p>")
    repeat = manifest.sections.get("calib_repeat")
    if isinstance(repeat, dict):
        body.append(f"<h2>Repeated calibration</h2><p>{_esc(RepeatResult.from_json(repeat).verdict())}</p>")
    if run.kind == "locate":
        body.append(gpu_section(load_report(run), "the locate report (locate.json) is unreadable"))
    body.append("</main>")
    return name, body


def _checked_diff(path: Path, diff: dict[str, Any]) -> dict[str, Any]:
    """A diff result read from a file handed in, as ``DiffResult`` reads it: every field of its type, written
    back by ``to_json`` for the page; a file that does not fit is one line (never an AttributeError or
    TypeError while the page is drawn)."""
    try:
        return DiffResult.from_json({"schema": DIFF_SCHEMA, **diff}).to_json()
    except QconsistError as exc:
        raise InputError(f"{path} is not a valid diff result: {exc.message}") from None
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise InputError(f"{path} is not a valid diff result: {' '.join(f'{type(exc).__name__}: {exc}'.split())[:200]}") from None


def render_paths(paths: Sequence[Path | str], explorer_dir: Path | None = None, relative_to: Path | None = None) -> str:
    """One page for any mix of run directories and ``qconsist diff --json`` files. With ``explorer_dir``, each
    diff's per-node divergence is also written there as Model Explorer node data (``<diff name>/``) and linked
    (relative to ``relative_to``, the report's folder)."""
    if not paths:
        raise InputError("give at least one run directory or diff JSON file")
    body: list[str] = []
    names = []
    for item in paths:
        path = Path(item)
        if path.is_file():
            try:
                diff = loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                raise InputError(f"{path} is not a diff or sensitivity JSON file ({exc})") from None
            if isinstance(diff, dict) and diff.get("schema") == SENSITIVITY_SCHEMA:
                result = SensitivityResult.from_json(diff)
                body += [banner(sensitivity_state(result), sensitivity_title(result), path.name), "<main>",
                         *sensitivity_section(result), "</main>"]
                names.append(path.stem)
                continue
            if not isinstance(diff, dict) or "tensors" not in diff:
                raise InputError(f"{path} is not a `qconsist diff --json` or `qconsist sensitivity --json` result "
                                 f"(no 'tensors', no schema {SENSITIVITY_SCHEMA})")
            diff = _checked_diff(path, diff)
            try:  # drawn from a file handed in: what does not fit the page is that file's fault, said in one line
                overlay = explorer_section(diff, explorer_dir / path.stem if explorer_dir is not None else None, relative_to)
                body += _diff_parts(diff, path.stem, overlay)
            except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
                raise InputError(f"{path} is not a valid diff result: "
                                 f"{' '.join(f'{type(exc).__name__}: {exc}'.split())[:200]}") from None
            names.append(path.stem)
        else:
            name, parts = _run_parts(path, relative_to)
            body += parts
            names.append(name)
    return page("qconsist report: " + ", ".join(names), body)
