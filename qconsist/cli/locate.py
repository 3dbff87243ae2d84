"""``qconsist locate``: which nodes make results vary on the GPU, and which configuration to pin."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List

import typer
from rich.text import Text

from qconsist.cli import options as opt
from qconsist.cli.app import note_run_ort_log, print_json, progress_for, stdout_console
from qconsist.cli.table import Rows
from qconsist.errors import EXIT_DIVERGED, ConfigError

if TYPE_CHECKING:
    from qconsist.inputs.options import InputOptions


def _configs(specs: list[str], searches: list[str], tf32: bool | None, workspace: bool, deterministic: bool):
    from qconsist.locate.config import default_matrix, parse_matrix, parse_search

    if specs:
        if searches or tf32 is not None or workspace or deterministic:
            raise ConfigError("`config` lists the configurations itself; drop `algo_search`, `tf32` and the variants")
        return parse_matrix(specs)
    modes = [parse_search(s) for text in searches or ["EXHAUSTIVE,HEURISTIC,DEFAULT"] for s in text.split(",") if s.strip()]
    return default_matrix(modes, (True, False) if tf32 is None else (tf32,), workspace, deterministic)


def _samples(**members):  # -> InputOptions
    """The inputs group, its ``count`` checked first against what locate reads (up to 256 samples)."""
    from qconsist.locate.run import check_count

    check_count(members["count"])
    return opt.INPUTS.build(**members)


@opt.uses(inputs=opt.Group(_samples, **opt.INPUTS.members).with_defaults(count=8).told(
    count="How many samples from --offset (default: 8).",
    pipeline="Pipeline file whose [preprocess] prepares images. Its [quantize] and [calibration] serve --calibration-repeats."),
    runs_dir=opt.RUNS)
def locate_command(
    model: opt.ModelArg,
    *,
    inputs: InputOptions,
    stage: opt.Stage = None,
    repeats: opt.told(opt.Repeats, "How many times the work is repeated and compared: fresh sessions per configuration (default 4).") = 4,
    batch_size: opt.BatchSize = 1,
    config: List[str] = typer.Option([], "--config", help="A configuration: SEARCH, then optionally /tf32=0|1, /workspace=0|1, /deterministic=0|1 (e.g. HEURISTIC/tf32=0); repeat or comma-separate; the first is the reference. Default: the matrix of --cudnn-conv-algo-search x --tf32."),
    algo_search: opt.AlgoSearches = [],  # noqa: B006 - typer's list default
    tf32: opt.told(opt.Tf32, "cuda: use_tf32 on or off (default: both are explored).") = None,
    workspace_variants: bool = typer.Option(False, "--workspace-variants", help="Matrix: add each config with cudnn_conv_use_max_workspace=0."),
    deterministic_variants: bool = typer.Option(False, "--deterministic-variants", help="Matrix: add each config with deterministic compute."),
    contention: bool = typer.Option(False, "--contention", help="Repeat again while another process loads the GPU with changing convolutions."),
    contention_workers: int = typer.Option(1, "--contention-workers", help="With --contention: how many processes load the GPU (1-16)."),
    warmup: opt.Warmup = 5,
    timed_runs: opt.TimedRuns = 30,
    max_cost: float = typer.Option(1.05, "--max-cost", help="Accepted latency of the recommended config, as a ratio to the fastest."),
    precision: str = typer.Option("fp32", "--precision", help="fp32: the configuration matrix; fp16: convert to float16 and find the first NaN/Inf/overflow."),
    ep: opt.Ep = "cuda",
    calibration_repeats: int = typer.Option(0, "--calibration-repeats", help="Also calibrate N times on the CUDA EP per search mode and compare with the CPU (0: off)."),
    session_runs: int = typer.Option(3, "--session-runs", help="Runs of each config's reference session compared with its first run (run-to-run variation); 1: off."),
    engines: opt.told(opt.Engines, more="Default: on, per configuration.") = True,
    engine_runs: opt.EngineRuns = 3,
    rewrite: bool = typer.Option(True, "--rewrite/--no-rewrite", help="When a ConvTranspose / ScatterElements varies and no fast config is stable: measure the model with those nodes rewritten (determinize)."),
    runs_dir: Path,
    run_id: opt.RunId = None,
    json_output: opt.Json = False,
    isa: opt.Isa = None,
) -> None:
    """Find the nodes whose outputs vary between fresh GPU sessions (repeat) or between cuDNN algorithm
    searches and TF32 (algorithm), time every configuration and recommend the fastest bit-stable one.

    Exit 0: a bit-stable config within --max-cost (and the fp16 / calibration checks passed).
    Exit 1: none, or fp16 found NaN/Inf/overflow, or GPU calibrations disagree.
    Exit 2: error. Exit 3: no usable CUDA GPU.

    With --ep cpu: the instruction sets of --isa (default native,Haswell,Nehalem; the emulated ones under
    QEMU user mode) × the session settings that change the integer path; the nodes that differ between
    instruction sets, and the setting bit-identical on all of them with its cost measured here.
    Exit 0: a setting is bit-identical on every instruction set; 1: none; 3: --isa without QEMU.
    """
    from qconsist.locate.latency import LatencyOptions
    from qconsist.locate.explore import LocateOptions
    from qconsist.locate.run import LocateRequest, run_locate

    if ep == "cpu" and precision == "fp32":
        from qconsist.cli.locate_isa import locate_cpu_command

        locate_cpu_command(model, stage, inputs, isa, runs_dir, run_id, timed_runs, json_output)
        return
    if isa is not None:
        raise ConfigError("`isa` chooses the instruction sets of `ep` cpu; the GPU matrix runs on this machine's GPU")
    if ep != "cuda" and precision != "fp16":
        raise ConfigError("the configuration matrix runs on the CUDA execution provider: `ep` cuda (or `precision` fp16 on another EP)")
    matrix = LocateOptions(
        configs=tuple(_configs(config, algo_search, tf32, workspace_variants, deterministic_variants)),
        repeats=repeats, contention=contention, contention_workers=contention_workers,
        latency=LatencyOptions(warmup, timed_runs), max_cost=max_cost, session_runs=session_runs,
        engines=engines, engine_runs=engine_runs, rewrite=rewrite,
    )
    request = LocateRequest(model=model, inputs=inputs, stage=stage, locate=matrix, batch_size=batch_size,
                            precision=_choice(precision, ("fp32", "fp16"), "precision"), fp16_ep=ep,
                            calibration_repeats=calibration_repeats)
    report, path = run_locate(request, runs_dir, sys.argv, run_id, progress_for(json_output))
    if json_output:
        print_json({**report.to_json(), "run_dir": str(path)})
    else:
        render(report, stdout_console())
        stdout_console().print(f"run directory: {path}")
        note_run_ort_log(path)
    if not report.passed:
        raise typer.Exit(EXIT_DIVERGED)


def _choice(value: str, allowed: tuple[str, ...], parameter: str) -> str:
    if value not in allowed:
        raise ConfigError(f"`{parameter}` must be one of {', '.join(allowed)}, not {value!r}")
    return value


# ------------------------------------------------------------------------------------------- rendering


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(k: int, n: int) -> str:
    return f"{k} / {n} ({100.0 * k / n:.2f}%)" if n else "0 / 0"


def _abs(value) -> str:
    return str(value) if isinstance(value, str) else f"{float(value):.3g}"


def _render_repeats(report, console) -> None:
    runs = any(cfg.repeat("run-to-run") for cfg in report.configs)
    phases = (["run-to-run"] if runs else []) + ["quiet"] + (["contention"] if report.contention else [])
    titles = {"run-to-run": "runs of one session", "quiet": "fresh sessions", "contention": "sessions under contention"}
    table = Rows("config", *(titles[phase] for phase in phases), "repeat origins",
                 title=f"Repeat stability: {report.repeats} fresh sessions per config"
                 + (" and the runs of its first session" if runs else ""))
    for cfg in report.configs:
        cells = []
        origins: list[str] = []
        for phase in phases:
            outcome = cfg.repeat(phase)
            if outcome is None:
                cells.append("-")
                continue
            same = outcome.sessions - len(outcome.differing_sessions)
            cells.append(f"{same}/{outcome.sessions} identical" if outcome.stable else
                         Text(f"{same}/{outcome.sessions} identical", style="red"))
            origins += [o for o in outcome.origins if o not in origins]
        table.add(cfg.label, *cells, ", ".join(origins) or "-")
    table.print(console)
    if report.contention:
        load = report.contention
        who = f"a {load.backend} process" if load.workers == 1 else f"{load.workers} {load.backend} processes"
        console.print(f"contention: {who} ran {load.iterations} convolution batches of "
                      f"changing shapes over {load.seconds:.1f} s during the repeats")


def _render_comparisons(report, console) -> None:
    table = Rows("compared", "why", "result", "first diverging node", "origins", "int8 values changed",
                 "output max diff", "top-1", title="Between configurations (same inputs, reference sessions)")
    kinds = report.kinds or [""] * len(report.comparisons)
    for result, why in zip(report.comparisons, kinds):
        pair = f"{result.reference} vs {result.other}"
        effect = result.effect
        table.add(
            pair, why, "identical" if result.identical else Text("differ", style="yellow"), result.first_node or "-",
            str(len(result.origins)), f"{result.int8_changed:,}", _abs(effect.greatest_abs),
            f"{effect.top1_agree}/{effect.samples}",
        )
    table.print(console)


def _render_nodes(report, console) -> None:
    if not report.nodes:
        console.print("origin nodes: none: every observed tensor was bit-identical in every comparison")
        return
    table = Rows("node", "op", "why", "origin in", "differing elements", "greatest abs diff", "int8 changed downstream",
                 "between", title="Origin nodes: outputs differ while all inputs are bit-identical (sizes over those samples)")
    samples = report.inputs.get("count") or "?"
    for node in report.nodes:
        between = node.between[0] + (f" (+{len(node.between) - 1})" if len(node.between) > 1 else "")
        table.add(node.label, node.op_type, node.why, f"{node.samples}/{samples}", _pct(node.differing, node.elements),
                  f"{node.greatest_abs:.3g}", f"{node.int8_downstream:,}", between)
    table.print(console)


def _render_tf32(report, console) -> None:
    console.print(report.tf32.override.explanation())
    for pair in report.tf32.pairs:
        if pair.identical:
            console.print(f"TF32: {pair.tf32_on} and {pair.tf32_off} are bit-identical")
        else:
            console.print(f"use_tf32 1 -> 0 changes {len(pair.origins)} origin node(s) ({pair.tf32_on} vs "
                          f"{pair.tf32_off}): {', '.join(pair.origins) or '-'}; first diverging node {pair.first_node}")


def _render_latency(report, console) -> None:
    rec = report.recommendation
    table = Rows("config", "first run", "median", "IQR", "spread", "vs fastest", "bit-stable", "observation",
                 title="Latency per config (ms, batch 1)")
    for cfg in report.configs:
        lat = cfg.latency
        ratio = f"{report.cost(cfg.label):.2f}x" if lat is not None and rec is not None else "-"  # paired where timed side by side
        runs = cfg.repeat("run-to-run")
        if cfg.faithful.get("faithful"):
            faithful = "faithful"
        elif runs is not None and not runs.stable:
            faithful = Text("n/a: varies run to run", style="yellow")  # no observation can match production bit for bit
        else:
            faithful = Text("NOT faithful", style="red")
        table.add(cfg.label, _ms(lat.first_run_ms if lat else None), _ms(lat.median_ms if lat else None),
                      f"{_ms(lat.p25_ms)}-{_ms(lat.p75_ms)}" if lat else "-", f"{lat.spread:.1%}" if lat else "-",
                  ratio, "yes" if cfg.stable else Text("no", style="red"), faithful)
    table.print(console)


def _render_recommendation(report, console) -> None:
    rec = report.recommendation
    if rec is None:
        return
    if rec.config is None:
        console.print(Text("recommendation: none", style="red"), ": no configuration was bit-stable across fresh sessions", sep="")
    else:
        setting = rec.config.replace("/", ", ").replace("tf32=", "use_tf32=")
        verdict = "accepted" if rec.accepted else "above the accepted cost"
        paired = f" by the median of {rec.paired.rounds} rounds timed side by side" if rec.paired is not None else ""
        console.print(
            f"recommendation: cudnn_conv_algo_search={setting}: {rec.median_ms:.2f} ms, {rec.cost:.2f}x the fastest "
            f"({rec.fastest} {rec.fastest_ms:.2f} ms){paired}; {verdict} (<= {rec.max_cost:.2f}x)"
        )
    for note in rec.notes:
        console.print(f"  note: {note}")


def _render_fp16(fp16, console) -> None:  # Fp16Report
    console.print(f"fp16 ({fp16.execution['provider']} EP, {fp16.samples} samples; "
                  f"{fp16.truncated_constants} constants clamped by the converter)")
    console.print(f"  {fp16.note()}")
    first, over = fp16.first_nonfinite, fp16.first_overflow
    if first:
        console.print(f"  first NaN/Inf: {first.label} ({first.op_type}, tensor {first.tensor}), sample "
                      f"{first.sample}: {first.nan} NaN, {first.inf} Inf (float32 max |x| {first.max_abs_fp32:.6g})")
    if over:
        console.print(f"  first overflow: {over.label} ({over.op_type}): float32 max |x| {over.max_abs_fp32:.6g} "
                      f"> 65504, sample {over.sample}")
    for finding in (first, over):
        if finding and len(finding.covers) > 1:
            console.print(f"    ({finding.label} computes {', '.join(finding.covers)})")
    if not first and not over:
        console.print("  no NaN, Inf or overflow")
    for node in fp16.worst_nodes[:3]:
        console.print(f"  {node.label}: greatest diff {node.max_abs:.3g} ({node.max_rel:.2e} of its largest value)")
    console.print(f"  final outputs: greatest diff {_abs(fp16.output_greatest_abs)}, top-1 agrees "
                  f"{fp16.top1_agree}/{fp16.effect.samples}")


def _render_calibration(calibration, console) -> None:  # GpuCalibrationReport
    console.print(f"GPU calibration: {calibration.verdict()}")
    console.print(f"  CPU: md5 {calibration.cpu_md5}")
    for mode in calibration.modes:
        md5s = ", ".join(sorted(set(mode.repeat.md5s)))
        cpu = "same as CPU" if mode.matches_cpu else f"differs from CPU in {len(mode.cpu_differences)} tensor(s)"
        console.print(f"  {mode.config}: {len(mode.repeat.md5s)} runs, md5 {md5s}; {cpu}")
        activations = sum(1 for d in mode.cpu_differences if d["kind"] == "activation")
        if mode.cpu_differences:
            console.print(f"    {activations} activation scale(s) differ from the CPU calibration; the largest:")
        for diff in mode.cpu_differences[:3]:
            rel = diff["scale_max_rel_diff"]
            shown = rel if isinstance(rel, str) else f"{100 * float(rel):.3g}%"
            console.print(f"    {diff['kind']} {diff['tensor']} (nodes {', '.join(diff['nodes'][:2])}): scale differs by "
                          f"up to {_abs(diff['scale_max_abs_diff'])} ({shown})")


def _render_engines(report, console) -> None:
    if not report.engines and not report.engine_errors:
        return
    origins = {n.label for n in report.nodes}
    console.print("cuDNN engines per convolution (cuDNN's API log, a child session of each config):")
    for record in report.engines:
        distinct = {e for n in record.nodes for e in n.runs if e != "-"}
        moving = [n for n in record.nodes if not n.same_engine]
        flagged = [n for n in record.nodes if n.nondeterministic]
        tried = sum(len(n.tried) for n in record.nodes)
        cost = (f", recording {record.seconds:.1f} s vs {record.plain_seconds:.1f} s without the log"
                if record.plain_seconds else "")
        console.print(
            f"  {record.config}: {len(record.nodes)} convolution(s) through cuDNN, {len(distinct)} distinct engine(s), "
            + (f"{len(flagged)} marked non-deterministic" if flagged else "none marked non-deterministic")
            + ("; the same engine in every run" if not moving else f"; {len(moving)} changed engine between runs")
            + (f"; its search executed {tried} candidate(s) first" if tried else "")
            + ("; final outputs identical in its runs" if record.outputs_stable else
               "; final outputs DIFFER between its runs")
            + cost
        )
        for node in record.nodes:
            if node.nondeterministic or not node.same_engine or node.label in origins:
                console.print(f"    {node.describe(record.config)}", markup=False)
        for miss in record.unmatched[:3]:
            console.print(f"    unmatched execution: {miss}")
    for config, error in report.engine_errors.items():
        console.print(f"  {config}: no engine record: {error}", markup=False)


def _render_alternative(report, console) -> None:
    alt = report.alternative
    if alt is None:
        return
    if not hasattr(alt, "configs"):
        console.print(f"rewrite alternative: none: {alt.reason}", markup=False)
        return
    console.print(f"rewrite alternative (determinize): {', '.join(alt.rewritten)}; outputs within "
                  f"{_abs(alt.outputs_max_abs)} of the original on the {alt.samples} inputs (CPU), top-1 agrees "
                  f"{alt.top1_agree}/{alt.samples}; determinize's own check {alt.check_max_abs:.3g}")
    rec = report.recommendation
    fastest = alt.original_fastest_ms
    for cfg in alt.configs:
        lat = cfg.latency
        state = "bit-stable" if cfg.stable else "VARIES"
        console.print(f"  rewritten, {cfg.label}: {_ms(lat.median_ms if lat else None)} ms "
                      f"({lat.median_ms / fastest:.2f}x the original's fastest), {state}" if lat else f"  {cfg.label}: -")
    best = alt.recommendation
    if best is not None and best.config is not None:
        original = (f"the original's stable {rec.config} {rec.median_ms:.2f} ms ({rec.cost:.2f}x)"
                    if rec is not None and rec.config else "no stable configuration of the original")
        console.print(f"  compare: {original} vs {best.config} + rewritten nodes {best.median_ms:.2f} ms "
                      f"({alt.cost_vs_original:.2f}x), bit-stable")


def render(report, console) -> None:
    """The report as the investigation reads: where, why, how big, what to set."""
    model = report.model.get("name") or report.model.get("path")
    device = report.device.get("name", "")
    console.print(f"qconsist locate: {model} ({report.model.get('path')}), {report.inputs.get('count')} inputs"
                  + (f", on {device}" if device else ""))
    if report.configs:
        _render_tf32(report, console)
        _render_repeats(report, console)
        _render_comparisons(report, console)
        _render_nodes(report, console)
        _render_engines(report, console)
        _render_latency(report, console)
        _render_recommendation(report, console)
        _render_alternative(report, console)
    if report.calibration is not None:
        _render_calibration(report.calibration, console)
    if report.fp16 is not None:
        _render_fp16(report.fp16, console)
    phases = report.device.get("phase_seconds") or {}
    if report.seconds:
        detail = ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items())
        console.print(f"locate took {report.seconds:.1f} s" + (f" ({detail})" if detail else ""))
