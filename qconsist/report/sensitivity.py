"""The report's section for a sensitivity analysis (``qconsist sensitivity``): the proposal with its predicted and
verified figures and latency cost, the lines to paste, the ranking of the probed nodes, how quant-error's first
pass relates to it, and what it all cost."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from qconsist.compare.statistics import MEASURED, sqnr_cell
from qconsist.sensitivity import SensitivityResult
from qconsist.sensitivity.figures import Figures

RANKED_ROWS = 30


def _db(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.2f}"


def _share(value: Any) -> str:
    return "—" if value is None else f"{value:.1%}"


def state(result: SensitivityResult) -> str:
    if not result.targets:
        return "neutral"
    return "pass" if result.passed else "fail"


def title(result: SensitivityResult) -> str:
    targets = ", ".join(t.text for t in result.targets)
    if not targets:
        return f"sensitivity of {result.model}: {len(result.probed)} node(s) ranked"
    verdict = "reaches" if result.passed else "does NOT reach"
    return f"sensitivity of {result.model}: the verified proposal {verdict} {targets}"


def _figures_table(columns: list[tuple[str, Figures | None]]) -> str:
    """One row per output or part, one column per model (all quantized, predicted, verified)."""
    present = [(name, f) for name, f in columns if f is not None]
    labels = [o.label for o in present[0][1].outputs] if present else []
    head = "".join(f"<th>{escape(name)}</th>" for name, _ in present)
    rows = []
    for i, label in enumerate(labels):
        kind = present[0][1].outputs[i].kind
        cells = "".join(f"<td>{_db(f.outputs[i].sqnr_db)} dB</td>" if not f.outputs[i].integer and f.outputs[i].figure == MEASURED else
                        f"<td>{sqnr_cell(None, f.outputs[i].figure)}</td>" if not f.outputs[i].integer else
                        f"<td>{f.outputs[i].identical_samples}/{f.samples} identical</td>" for _, f in present)
        rows.append(f"<tr><td><code>{escape(label)}</code> ({escape(kind)})</td>{cells}</tr>")
    extra = [("top-1 agreement", lambda f: _share(f.top1_agreement)), ("accuracy", lambda f: _share(f.accuracy)),
             ("accuracy drop (points)", lambda f: _db(f.accuracy_drop))]
    for name, read in extra:
        if any(read(f) != "—" for _, f in present):
            rows.append(f"<tr><td>{name}</td>" + "".join(f"<td>{read(f)}</td>" for _, f in present) + "</tr>")
    return f"<table><tr><th>output (SQNR against the float model)</th>{head}</tr>" + "".join(rows) + "</table>"


def _proposal(result: SensitivityResult) -> list[str]:
    p, v, lat = result.proposal, result.verification, result.latency
    if p is None:
        return ['<p class="muted">No target was given: the nodes are ranked, nothing is proposed.</p>']
    what = f"keep {len(p.nodes)} node(s) in float" if p.nodes else "keep no node in float"
    if p.quantize_changes:
        what += " and set " + ", ".join(f"<code>{escape(k)} = {escape(repr(val))}</code>" for k, val in p.quantize_changes.items())
    out = [f"<p>Proposal for <code>{escape(', '.join(t.text for t in result.targets))}</code>: {what}"
           + ("" if p.reached else " — <strong>does not reach the targets</strong> on the probe inputs") + ".</p>"]
    if p.nodes:
        out.append("<p>Nodes: " + ", ".join(f"<code>{escape(n)}</code>" for n in p.nodes) + "</p>")
    out.append(_figures_table([("all quantized", result.baseline), ("predicted (search)", p.predicted),
                               ("verified (quantize stage)", v.measured if v is not None else None)]))
    if v is not None:
        same = ("byte-identical to the model the search measured" if v.same_as_predicted
                else "<strong>not</strong> identical to the model the search measured (the calibration did not repeat)")
        out.append(f"<p>Verified: re-made by the pipeline's quantize stage, calibration included (md5 <code>{escape(v.md5)}</code>, "
                   f"{same}): {'reaches' if v.reached else '<strong>does not reach</strong>'} the targets.</p>")
        for line in v.stage_failures:
            out.append(f'<p class="reasons">The quantize stage\'s own check: FAILED {escape(line)}</p>')
    if lat is not None:
        out.append(f"<p>Latency on {escape(lat.provider)}, median of {lat.runs} side-by-side runs: all quantized "
                   f"{lat.quantized_ms:.3f} ms, proposed {lat.proposed_ms:.3f} ms (<strong>{lat.ratio:.2f}×</strong>), "
                   f"float {lat.float_ms:.3f} ms ({lat.float_ratio:.2f}×).</p>")
    if (p.nodes or p.quantize_changes) and v is not None and v.reached:
        out.append("<p>In the pipeline file:</p><pre>" + escape("\n".join(p.pipeline_lines(result.existing_exclusions))) + "</pre>")
    out.append(f'<p class="muted">Method: {escape(p.method)}. Guarantee: {escape(p.guarantee)}.</p>')
    for step in result.alternatives:
        with_nodes = f" with {', '.join(step.excluded)} in float" if step.excluded else ""
        out.append(f"<p>Alternative <code>{escape(step.node)}</code>{escape(with_nodes)}: {escape(step.figures.describe())} — "
                   f"{'reaches' if step.met else 'misses'} the targets.</p>")
    if p.steps:
        rows = "".join(f"<tr><td>{escape(s.action)}</td><td><code>{escape(s.node)}</code></td><td>{len(s.excluded)}</td>"
                       f"<td>{_db(s.figures.worst_sqnr_db)}</td><td>{'yes' if s.met else 'no'}</td></tr>" for s in p.steps)
        out.append(f"<details><summary>Search steps ({len(p.steps)} probes)</summary><table><tr><th>step</th><th>node</th>"
                   f"<th>nodes in float</th><th>worst output dB</th><th>targets met</th></tr>{rows}</table></details>")
    return out


def _ranking(result: SensitivityResult) -> list[str]:
    probed = result.probed
    out = [f"<h2>Nodes by their effect on the final outputs</h2><p>Each node kept in float alone, the rest quantized from "
           f"the run's one calibration; probed: {escape(result.strategy)}.</p>"]
    rows = []
    for n in probed[:RANKED_ROWS]:
        worst = n.probe.worst if n.probe is not None else None
        first = n.first_pass
        rows.append(f"<tr><td>{n.rank}</td><td><code>{escape(n.node)}</code></td><td>{escape(n.op_type)}</td>"
                    f"<td>{_db(worst.sqnr_db if worst else None)}</td><td>{_db(n.gain_db)}"
                    f"{' (same model)' if n.same_model_as_baseline else ''}</td>"
                    f"<td>{_share(n.probe.top1_agreement if n.probe else None)}</td><td>{n.first_pass_rank or '—'}</td>"
                    f"<td>{_db(first.added_db if first else None)}</td><td>{_db(first.sqnr_db if first else None)}</td></tr>")
    out.append("<table><tr><th>rank</th><th>node</th><th>op</th><th>worst output dB</th><th>gain dB</th><th>top-1</th>"
               "<th>quant-error rank</th><th>added dB</th><th>SQNR dB</th></tr>" + "".join(rows) + "</table>")
    if len(probed) > RANKED_ROWS:
        out.append(f'<p class="muted">… {len(probed) - RANKED_ROWS} more probed nodes in the JSON result.</p>')
    a = result.agreement
    if a is not None:
        def rho(value: float | None) -> str:
            return "—" if value is None else f"{value:+.2f}"
        out.append(f"<p>quant-error's first pass against the probes over {a.nodes} probed nodes: Spearman {rho(a.spearman_added)} "
                   f"(added dB), {rho(a.spearman_sqnr)} (SQNR); {a.overlap} of the probes' top {a.top} in quant-error's top {a.top}.</p>")
    return out


def sensitivity_section(result: SensitivityResult, heading: str = "h2") -> list[str]:
    """The section's HTML pieces (``heading``: the level of its title)."""
    e = result.execution
    cost = result.cost
    spent = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in cost.seconds.items() if k != "total")
    out = [f"<{heading}>Sensitivity: which nodes to keep in float</{heading}>",
           f"<p>Run <code>{escape(result.run)}</code> ({escape(result.model)}): quantize from {escape(result.float_stage)}; probes "
           f"on {escape(str(e.get('provider')))} at level {escape(str(e.get('graph_optimization_level')))}, {result.samples} samples "
           f"(<code>{escape(str(result.inputs.get('source')))}</code>); {result.quantizable} quantizable nodes. All quantized (re-made "
           f"from the run's recorded ranges{', the run’s own model' if result.baseline_md5 == result.run_md5 else ', NOT the run’s model'}): "
           f"{escape(result.baseline.describe())}.</p>",
           *_proposal(result), *_ranking(result),
           f"<p class=\"muted\">Cost: {cost.sessions} sessions, {cost.quantizations} quantizations ({cost.probes} probes, "
           f"{cost.reused} answered by an identical model), {cost.seconds.get('total', 0.0):.1f} s ({escape(spent)}).</p>"]
    return out
