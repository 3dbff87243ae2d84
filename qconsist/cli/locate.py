"""``qconsist locate``: which nodes make results vary on the GPU, and which configuration to pin."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from qconsist.cli.app import app, handles_errors, print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED, ConfigError


def _configs(specs: list[str], search: str, tf32: str, workspace: bool, deterministic: bool):
    from qconsist.gpu.config import default_matrix, parse_matrix, parse_search

    if specs:
        if search != "EXHAUSTIVE,HEURISTIC,DEFAULT" or tf32 != "both" or workspace or deterministic:
            raise ConfigError("--config lists the configurations itself; drop --search/--tf32/--*-variants")
        return parse_matrix(specs)
    tf32_values = {"both": (True, False), "on": (True,), "off": (False,)}
    if tf32 not in tf32_values:
        raise ConfigError(f"--tf32 must be both, on or off, not {tf32!r}")
    searches = [parse_search(s) for s in search.split(",") if s.strip()]
    return default_matrix(searches, tf32_values[tf32], workspace, deterministic)


@app.command("locate")
@handles_errors
def locate_command(
    model: Path = typer.Argument(..., help="An .onnx file, or a run directory (its --stage artifact)."),
    inputs: str = typer.Option(..., "--inputs", help="Folder of images, .npy/.npz file, folder of .npy, or package:photos."),
    stage: Optional[str] = typer.Option(None, "--stage", help="Stage of a run directory (default: quantize)."),
    pipeline: Optional[Path] = typer.Option(None, "--pipeline", help="Pipeline file: its [preprocess] prepares images; its [quantize] and [calibration] serve --calibration-repeats."),
    offset: int = typer.Option(0, "--offset", help="First sample of the input set."),
    count: int = typer.Option(8, "--count", help="Samples to run (1-256)."),
    repeats: int = typer.Option(4, "--repeats", "-k", help="Fresh sessions per configuration (>= 2)."),
    config: List[str] = typer.Option([], "--config", help="A configuration: SEARCH, then optionally /tf32=0|1, /workspace=0|1, /deterministic=0|1 (e.g. HEURISTIC/tf32=0); repeat or comma-separate; the first is the reference. Default: the matrix of --search x --tf32."),
    search: str = typer.Option("EXHAUSTIVE,HEURISTIC,DEFAULT", "--search", help="Matrix: cudnn_conv_algo_search modes."),
    tf32: str = typer.Option("both", "--tf32", help="Matrix: use_tf32 both, on or off."),
    workspace_variants: bool = typer.Option(False, "--workspace-variants", help="Matrix: add each config with cudnn_conv_use_max_workspace=0."),
    deterministic_variants: bool = typer.Option(False, "--deterministic-variants", help="Matrix: add each config with deterministic compute."),
    contention: bool = typer.Option(False, "--contention", help="Repeat again while another process loads the GPU with changing convolutions."),
    contention_workers: int = typer.Option(1, "--contention-workers", help="With --contention: how many processes load the GPU (1-16)."),
    warmup: int = typer.Option(5, "--warmup", help="Latency: warm-up runs after the first one."),
    runs: int = typer.Option(30, "--runs", help="Latency: timed runs (median and spread)."),
    max_cost: float = typer.Option(1.05, "--max-cost", help="Accepted latency of the recommended config, as a ratio to the fastest."),
    precision: str = typer.Option("fp32", "--precision", help="fp32: the configuration matrix; fp16: convert to float16 and find the first NaN/Inf/overflow."),
    fp16_ep: str = typer.Option("cuda", "--fp16-ep", help="Execution provider of --precision fp16: cuda or cpu."),
    calibration_repeats: int = typer.Option(0, "--calibration-repeats", help="Also calibrate N times on the CUDA EP per search mode and compare with the CPU (0: off)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run directories go."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run directory (default: generated)."),
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Find the nodes whose outputs vary between fresh GPU sessions (repeat) or between cuDNN algorithm
    searches and TF32 (algorithm), time every configuration and recommend the fastest bit-stable one.

    Exit 0: a bit-stable config within --max-cost (and the fp16 / calibration checks passed).
    Exit 1: none, or fp16 found NaN/Inf/overflow, or GPU calibrations disagree.
    Exit 2: error. Exit 3: no usable CUDA GPU.
    """
    from qconsist.gpu.latency import LatencyOptions
    from qconsist.gpu.locate import LocateOptions
    from qconsist.gpu.run import LocateRequest, run_locate

    _quiet_onnxruntime()
    request = LocateRequest(
        model=model, inputs=inputs, stage=stage, pipeline=pipeline, offset=offset, count=count,
        precision=_choice(precision, ("fp32", "fp16"), "--precision"),
        fp16_ep=_choice(fp16_ep, ("cuda", "cpu"), "--fp16-ep"),
        locate=LocateOptions(
            configs=tuple(_configs(config, search, tf32, workspace_variants, deterministic_variants)),
            repeats=repeats, contention=contention, contention_workers=contention_workers, latency=LatencyOptions(warmup, runs), max_cost=max_cost,
        ),
        calibration_repeats=calibration_repeats,
    )
    report, path = run_locate(request, runs_dir, sys.argv, run_id, progress_for(json_output))
    if json_output:
        print_json({**report.to_json(), "run_dir": str(path)})
    else:
        render(report, stdout_console())
        stdout_console().print(f"run directory: {path}")
    if not report.passed:
        raise typer.Exit(EXIT_DIVERGED)


def _quiet_onnxruntime() -> None:
    """ONNX Runtime's process-wide logger prints kernel warnings on stderr (the CUDA EP warns for every Conv
    in DEFAULT search: "running in Fallback mode"); keep them for --verbose only."""
    import logging

    import onnxruntime as ort

    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        ort.set_default_logger_severity(3)


def _choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{option} must be one of {', '.join(allowed)}, not {value!r}")
    return value


# ------------------------------------------------------------------------------------------- rendering


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(k: int, n: int) -> str:
    return f"{k} / {n} ({100.0 * k / n:.2f}%)" if n else "0 / 0"


def _abs(value) -> str:
    return str(value) if isinstance(value, str) else f"{float(value):.3g}"


def _render_repeats(report, console) -> None:
    phases = ["quiet"] + (["contention"] if report.contention else [])
    table = Table(title=f"Repeat stability: {report.repeats} fresh sessions per config", title_justify="left")
    table.add_column("config")
    for phase in phases:
        table.add_column(phase)
    table.add_column("repeat origins")
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
        table.add_row(cfg.label, *cells, ", ".join(origins) or "-")
    console.print(table)
    if report.contention:
        load = report.contention
        workers = load.get("workers", 1)
        who = f"a {load['backend']} process" if workers == 1 else f"{workers} {load['backend']} processes"
        console.print(f"contention: {who} ran {load['iterations']} convolution batches of "
                      f"changing shapes over {load['seconds']:.1f} s during the repeats")


def _render_comparisons(report, console) -> None:
    table = Table(title="Between configurations (same inputs, reference sessions)", title_justify="left")
    for column in ("compared", "why", "result", "first diverging node", "origins", "int8 values changed",
                   "output max diff", "top-1"):
        table.add_column(column)
    kinds = report.kinds or [""] * len(report.comparisons)
    for result, why in zip(report.comparisons, kinds):
        pair = f"{result.reference} vs {result.other}"
        effect = result.effect
        table.add_row(
            pair, why, "identical" if result.identical else Text("differ", style="yellow"), result.first_node or "-",
            str(len(result.origins)), f"{result.int8_changed:,}", _abs(effect.greatest_abs),
            f"{effect.top1_agree}/{effect.samples}",
        )
    console.print(table)


def _render_nodes(report, console) -> None:
    if not report.nodes:
        console.print("origin nodes: none: every observed tensor was bit-identical in every comparison")
        return
    table = Table(title="Origin nodes: outputs differ while all inputs are bit-identical (sizes over those samples)",
                  title_justify="left")
    for column in ("node", "op", "why", "origin in", "differing elements", "greatest abs diff",
                   "int8 changed downstream", "between"):
        table.add_column(column)
    samples = report.inputs.get("count") or "?"
    for node in report.nodes:
        between = node.between[0] + (f" (+{len(node.between) - 1})" if len(node.between) > 1 else "")
        table.add_row(node.label, node.op_type, node.why, f"{node.samples}/{samples}", _pct(node.differing, node.elements),
                      f"{node.greatest_abs:.3g}", f"{node.int8_downstream:,}", between)
    console.print(table)


def _render_tf32(report, console) -> None:
    console.print(report.tf32["override"]["explanation"])
    for pair in report.tf32["pairs"]:
        if pair["identical"]:
            console.print(f"TF32: {pair['tf32_on']} and {pair['tf32_off']} are bit-identical")
        else:
            console.print(f"use_tf32 1 -> 0 changes {len(pair['origins'])} origin node(s) ({pair['tf32_on']} vs "
                          f"{pair['tf32_off']}): {', '.join(pair['origins']) or '-'}; first diverging node {pair['first_node']}")


def _render_latency(report, console) -> None:
    rec = report.recommendation
    table = Table(title="Latency per config (ms, batch 1)", title_justify="left")
    for column in ("config", "first run", "median", "IQR", "spread", "vs fastest", "bit-stable", "observation"):
        table.add_column(column)
    for cfg in report.configs:
        lat = cfg.latency
        ratio = f"{lat.median_ms / rec.fastest_ms:.2f}x" if lat and rec else "-"
        faithful = "faithful" if cfg.faithful.get("faithful") else Text("NOT faithful", style="red")
        table.add_row(cfg.label, _ms(lat.first_run_ms if lat else None), _ms(lat.median_ms if lat else None),
                      f"{_ms(lat.p25_ms)}-{_ms(lat.p75_ms)}" if lat else "-", f"{lat.spread:.1%}" if lat else "-",
                      ratio, "yes" if cfg.stable else Text("no", style="red"), faithful)
    console.print(table)


def _render_recommendation(report, console) -> None:
    rec = report.recommendation
    if rec is None:
        return
    if rec.config is None:
        console.print(Text("recommendation: none", style="red"), ": no configuration was bit-stable across fresh sessions", sep="")
    else:
        setting = rec.config.replace("/", ", ").replace("tf32=", "use_tf32=")
        verdict = "accepted" if rec.accepted else "above the accepted cost"
        console.print(
            f"recommendation: cudnn_conv_algo_search={setting}: {rec.median_ms:.2f} ms, {rec.cost:.2f}x the fastest "
            f"({rec.fastest} {rec.fastest_ms:.2f} ms); {verdict} (<= {rec.max_cost:.2f}x)"
        )
    for note in rec.notes:
        console.print(f"  note: {note}")


def _render_fp16(fp16, console) -> None:
    console.print(f"fp16 ({fp16['execution']['ep']} EP, {fp16['samples']} samples; "
                  f"{fp16['truncated_constants']} constants clamped by the converter)")
    console.print(f"  {fp16['note']}")
    first = fp16["first_nonfinite"]
    if first:
        console.print(f"  first NaN/Inf: {first['label']} ({first['op_type']}, tensor {first['tensor']}), sample "
                      f"{first['sample']}: {first['nan']} NaN, {first['inf']} Inf (float32 max |x| {first['max_abs_fp32']:.6g})")
    over = fp16["first_overflow"]
    if over:
        console.print(f"  first overflow: {over['label']} ({over['op_type']}): float32 max |x| {over['max_abs_fp32']:.6g} "
                      f"> 65504, sample {over['sample']}")
    for finding in (first, over):
        if finding and len(finding.get("covers", [])) > 1:
            console.print(f"    ({finding['label']} computes {', '.join(finding['covers'])})")
    if not first and not over:
        console.print("  no NaN, Inf or overflow")
    for node in fp16["worst_nodes"][:3]:
        console.print(f"  {node['label']}: greatest diff {node['max_abs']:.3g} ({node['max_rel']:.2e} of its largest value)")
    console.print(f"  final outputs: greatest diff {_abs(fp16['output_greatest_abs'])}, top-1 agrees "
                  f"{fp16['top1_agree']}/{fp16['samples']}")


def _render_calibration(calibration, console) -> None:
    console.print(f"GPU calibration: {calibration['verdict']}")
    console.print(f"  CPU: md5 {calibration['cpu_md5']}")
    for mode in calibration["modes"]:
        md5s = ", ".join(sorted(set(mode["md5s"])))
        cpu = "same as CPU" if mode["matches_cpu"] else f"differs from CPU in {len(mode['cpu_differences'])} tensor(s)"
        console.print(f"  {mode['config']}: {len(mode['md5s'])} runs, md5 {md5s}; {cpu}")
        activations = sum(1 for d in mode["cpu_differences"] if d["kind"] == "activation")
        if mode["cpu_differences"]:
            console.print(f"    {activations} activation scale(s) differ from the CPU calibration; the largest:")
        for diff in mode["cpu_differences"][:3]:
            rel = diff["scale_max_rel_diff"]
            shown = rel if isinstance(rel, str) else f"{100 * float(rel):.3g}%"
            console.print(f"    {diff['kind']} {diff['tensor']} (nodes {', '.join(diff['nodes'][:2])}): scale differs by "
                          f"up to {_abs(diff['scale_max_abs_diff'])} ({shown})")


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
        _render_latency(report, console)
        _render_recommendation(report, console)
    if report.calibration:
        _render_calibration(report.calibration, console)
    if report.fp16:
        _render_fp16(report.fp16, console)
    phases = report.device.get("phase_seconds") or {}
    if report.seconds:
        detail = ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items())
        console.print(f"locate took {report.seconds:.1f} s" + (f" ({detail})" if detail else ""))
