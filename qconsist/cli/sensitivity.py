"""``qconsist sensitivity RUN``: which nodes to keep in float, and a verified list for a target."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, List

import typer
from qconsist.cli.table import Rows, more

from qconsist.cli import options as opt
from qconsist.cli.app import note_run_ort_log, print_json, progress_for, stdout_console
from qconsist.cli.emulated import isa_line, reexec_under
from qconsist.errors import EXIT_DIVERGED, EXIT_OK, ConfigError

if TYPE_CHECKING:
    from qconsist.inference.session import ExecutionOptions
    from qconsist.inputs.options import InputOptions


def _db(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _seconds(cost) -> str:
    names = [("first_pass", "first pass"), ("probes", "probes"), ("search", "search"), ("verify", "verify"), ("latency", "latency")]
    parts = [f"{label} {cost.seconds[key]:.1f} s" for key, label in names if key in cost.seconds]
    probe = cost.probe_parts
    per = (f" (median per probe: quantize {probe['quantize']:.2f} s, session {probe['session']:.2f} s, inference "
           f"{probe['inference']:.2f} s)") if probe else ""
    return (f"cost: {cost.sessions} sessions, {cost.quantizations} quantizations ({cost.probes} probes, {cost.reused} "
            f"answered by an identical model), {cost.seconds.get('total', 0.0):.1f} s: " + ", ".join(parts) + per)


def render(result, top: int, path: Path | None) -> None:  # result: SensitivityResult
    console = stdout_console()
    e = result.execution
    console.print(f"sensitivity of {result.run} ({result.model}): quantize from {result.float_stage}, probes on "
                  f"{e['provider']} level {e['graph_optimization_level']}, {result.samples} samples "
                  f"({result.inputs.get('source')})" + (f", {result.labels} labelled" if result.labels else ""))
    reproduced = "the run's own" if result.baseline_md5 == result.run_md5 else f"NOT the run's {result.run_md5[:12]}…"
    console.print(f"all quantized (re-made from the run's recorded ranges: md5 {result.baseline_md5[:12]}…, {reproduced}): "
                  f"{result.baseline.describe()}")
    ops = Counter(n.op_type for n in result.nodes)
    console.print(f"quantizable nodes: {result.quantizable} ({', '.join(f'{op} {k}' for op, k in ops.most_common())})"
                  + (f", {result.unnamed} unnamed (cannot be excluded by name: [optimize] name_nodes = true names them)" if result.unnamed else "") + f"; probed: {result.strategy}")
    table = Rows("rank", "node", "op", "worst output dB", "gain dB", "top-1", "quant-error rank", "added dB", "SQNR dB", name=1)
    for n in result.probed[:top]:
        worst = n.probe.worst if n.probe is not None else None
        table.add(str(n.rank), n.node, n.op_type, f"{_db(worst.sqnr_db if worst else None)} {worst.label if worst else ''}",
                      _db(n.gain_db) + (" (same model)" if n.same_model_as_baseline else ""),
                      _share(n.probe.top1_agreement if n.probe else None), str(n.first_pass_rank or "-"),
                      _db(n.first_pass.added_db if n.first_pass else None), _db(n.first_pass.sqnr_db if n.first_pass else None))
    table.print(console)
    cut = more(top, len(result.probed), "probed nodes", "--top N, --json")
    if cut:
        console.print(cut)
    a = result.agreement
    if a is not None:
        def rho(value: float | None) -> str:
            return "-" if value is None else f"{value:+.2f}"
        console.print(f"quant-error vs probes over {a.nodes} probed nodes: Spearman {rho(a.spearman_added)} (added dB), "
                      f"{rho(a.spearman_sqnr)} (SQNR); {a.overlap} of the probes' top {a.top} in quant-error's top {a.top}")
    for step in result.alternatives:
        console.print(f"alternative {step.node}" + (f" with {', '.join(step.excluded)} in float" if step.excluded else "")
                      + f": {step.figures.describe()} — {'reaches' if step.met else 'misses'} the targets")
    p, v = result.proposal, result.verification
    if p is not None:
        targets = ", ".join(t.text for t in result.targets)
        what = (f"keep {len(p.nodes)} node(s) in float" if p.nodes else "keep no node in float")
        if p.quantize_changes:
            what += " and set " + ", ".join(f"{k} = {v!r}" for k, v in p.quantize_changes.items())
        console.print(f"proposal for {targets}: {what}" + ("" if p.reached else " — DOES NOT reach the targets on the probe inputs"))
        console.print(f"  method: {p.method}")
        console.print(f"  guarantee: {p.guarantee}")
        console.print(f"  predicted: {p.predicted.describe()}")
    if v is not None:
        same = ("identical to the model the search measured" if v.same_as_predicted
                else "NOT identical to the model the search measured (the calibration did not repeat)")
        console.print(f"  verified:  {v.measured.describe()} — {'reaches' if v.reached else 'DOES NOT reach'} the targets "
                      f"(re-made by the pipeline's quantize stage, calibration included: md5 {v.md5[:12]}…, {same})")
        for line in v.stage_failures:
            console.print(f"  the quantize stage's own check: FAILED {line}")
    lat = result.latency
    if lat is not None:
        console.print(f"latency on {lat.provider} (median of {lat.runs} side-by-side runs): all quantized {lat.quantized_ms:.2f} ms, "
                      f"proposed {lat.proposed_ms:.2f} ms: {lat.ratio:.2f}x; float {lat.float_ms:.2f} ms ({lat.float_ratio:.2f}x)")
    if p is not None and (p.nodes or p.quantize_changes) and v is not None and v.reached:
        console.print("in the pipeline file:")
        for line in p.pipeline_lines(result.existing_exclusions):
            console.print(f"  {line}")
    console.print(isa_line(result.instruction_set))
    console.print(_seconds(result.cost))
    if path is not None:
        console.print(f"run {path.name}: {path}")


@opt.uses(inputs=opt.INPUTS.with_defaults(inputs=None), execution=opt.EXECUTION, runs_dir=opt.RUNS)
def sensitivity(
    run: Path = typer.Argument(..., help="A pipeline run directory (or a nightly entry): its float model, quantize options and recorded calibration ranges."),
    *,
    target: List[str] = typer.Option([], "--target", help='What the proposal must reach, e.g. "sqnr>=40" (dB, every output and part), "sqnr[prob]>=45", "cosine>=0.999", "max-abs<=0.01", "top1>=0.999", "accuracy-drop<=0.1" (points, needs --labels); repeatable, all must hold. None: rank only.'),
    candidates: int = typer.Option(16, "--candidates", min=1, help="How many nodes to probe one by one: the first pass's (quant-error's) top N, and, while a target is not reached, N more at a time (--no-widen: only the first N)."),
    all_nodes: bool = typer.Option(False, "--all", help="Probe every quantizable node (slower; also measures how quant-error's ranking relates to the probes')."),
    widen: bool = typer.Option(True, "--widen/--no-widen", help="While the proposal does not reach the targets, probe the first pass's next --candidates nodes (until every node is probed)."),
    inputs: InputOptions,
    execution: ExecutionOptions,
    warmup: opt.Warmup = 5,
    timed_runs: opt.TimedRuns = 30,
    alternatives: bool = typer.Option(True, "--alternatives/--no-alternatives", help="When keeping nodes in float cannot reach the targets, measure 16-bit activations (then activations and weights), from the same calibration, and propose the first that reaches them."),
    top: opt.Top = 20,
    runs_dir: Path,
    run_id: opt.RunId = None,
    json_output: opt.Json = False,
    isa: opt.Isa = None,
) -> None:
    """Rank the quantizable nodes of a pipeline run by the effect of keeping each one in float on the final
    outputs (probes of the top --candidates of quant-error's ranking, or --all), reusing the run's one
    calibration; with --target, propose the nodes to keep in float, re-make the proposal with the pipeline's
    quantize stage, measure it and its latency cost on --ep, and print the [quantize] lines to paste.

    With --isa MODEL the analysis runs in a child process under QEMU user mode emulating that CPU model, and its
    run directory records the emulated instruction set as its environment.

    Exit 0 done (the verified proposal reaches every target), 1 the proposal does not reach a target, 2 error,
    3 the execution provider is missing (or --isa without QEMU).
    """
    if isa is not None and reexec_under(isa, quiet=json_output):
        return
    from qconsist.locate.latency import LatencyOptions
    from qconsist.sensitivity import SensitivityRequest, parse_targets
    from qconsist.sensitivity import sensitivity as analyse

    request = SensitivityRequest(targets=parse_targets(target), candidates=None if all_nodes else candidates,
                                 execution=execution, latency=LatencyOptions(warmup=warmup, runs=timed_runs),
                                 alternatives=alternatives, widen=widen)
    probe_inputs, by_name = _probe_inputs(run, inputs)
    result, path = analyse(run, request, probe_inputs, by_name, runs_dir=runs_dir, run_id=run_id,
                           progress=progress_for(json_output))
    if json_output:
        print_json(result)
    else:
        render(result, top, path)
        if path is not None:
            note_run_ort_log(path)
    raise typer.Exit(EXIT_OK if result.passed else EXIT_DIVERGED)


def _probe_inputs(run: Path, inputs: InputOptions):  # -> (InputSet | None, labels by sample name | None)
    """The samples the probes run on: ``inputs`` prepared for the run's float model, or the run's own evaluation
    inputs (sliced by ``offset``/``count``), labelled by sample name where ``labels`` is given."""
    from qconsist.inference import resolve_model
    from qconsist.inputs.labels import read_labels
    from qconsist.pipeline.inputs import open_inputs
    from qconsist.sensitivity.source import open_quantized_run

    if inputs.source is not None:
        source = open_quantized_run(run)
        return open_inputs(inputs, resolve_model(source.path, source.float_stage)), None
    if inputs.pipeline is not None:
        raise ConfigError("`pipeline` prepares the images of `inputs`: give `inputs` too (without it, the run's own "
                          "evaluation inputs are used, prepared as the run prepared them)")
    by_name = dict(read_labels(inputs.labels).by_name) if inputs.labels is not None else None
    if inputs.offset or inputs.count is not None:
        return open_quantized_run(run).inputs("evaluation").subset(inputs.offset, inputs.count), by_name
    return None, by_name
