"""``qconsist nightly``: every model of a nightly file through pipeline, dumps, locate, diff and gate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, progress_for, stdout_console


def render_night(result) -> None:  # NightlyResult
    console = stdout_console()
    counts = result.summary()
    console.print(f"night {result.night_id}: {counts['pass']} pass, {counts['fail']} fail, {counts['error']} error"
                  + (f" ({result.executor} executor)" if result.executor != "local" else ""))
    skipped = [entry.locate_skipped for entry in result.entries if entry.locate_skipped]
    for entry in result.entries:
        gpu = f"  [{entry.gpu_label}]" if entry.gpu_type or entry.gpus else ""
        if entry.devices:  # the GPU(s) it ran on, as the host numbers them
            gpu += f" on {', '.join(d.short for d in entry.devices)}"
        console.print(f"  {entry.status.upper():<5} {entry.model}{gpu}  ({entry.seconds:.1f} s)  {entry.entry_run or ''}")
        if entry.error:
            console.print(f"        error: {entry.error}")
        if entry.verdict is not None:
            for reason in entry.verdict.reasons:
                console.print(f"        {reason}")
        if entry.locate_skipped and skipped.count(entry.locate_skipped) == 1:
            console.print(f"        locate skipped: {entry.locate_skipped}")
        fix = entry.sensitivity
        if fix is not None:
            if fix.get("error"):
                console.print(f"        sensitivity: error: {fix['error']}")
            elif fix.get("passed"):
                console.print(f"        candidate fix, verified for {', '.join(fix['targets'])} (run {fix.get('run')}): "
                              + "; ".join(line for line in fix.get("lines") or [] if line != "[quantize]"))
            else:
                console.print(f"        sensitivity: no verified fix reaches {', '.join(fix['targets'])} (run {fix.get('run')})")
        for attempt in entry.attempts:
            console.print(f"        retried: {attempt} (left incomplete: {attempt.entry_run})")
    retried = result.retries()
    if retried:
        console.print(f"retries: {len(retried)} entr{'y' if len(retried) == 1 else 'ies'} needed a retry: {', '.join(retried)}")
    for reason in dict.fromkeys(r for r in skipped if skipped.count(r) > 1):  # the same sentence once, not per entry
        console.print(f"locate skipped for {skipped.count(reason)} entries: {reason}")
    for comparison in result.across_gpus:
        console.print(f"across {'devices' if comparison.scope == 'device' else 'GPU types'}: {comparison}")
    if result.seconds:
        console.print(f"wall time: {result.seconds:.1f} s (entries together: {sum(e.seconds for e in result.entries):.1f} s)")
    if result.handout is not None and len(result.handout.order) > 1:
        console.print(str(result.handout))
    console.print(f"report: {result.path / 'report.html'}")
    console.print(f"history: {result.history}")
    failing = [entry.model for entry in result.entries if entry.status != "pass"]
    console.print(f"FAIL night {result.night_id}: {len(failing)} of {len(result.entries)} entries did not pass: {', '.join(failing)}"
                  if failing else f"PASS night {result.night_id}: {len(result.entries)} entries passed")


def nightly(
    file: Path = typer.Argument(..., parser=opt.read_path, help="Nightly file (TOML), e.g. pipelines/nightly.toml."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Run only this model, or one GPU type of it as NAME@TYPE (repeatable)."),
    runs_dir: opt.RunsDir = None,
    history: opt.told(opt.History, "History database (default: the nightly file's history, else <runs_dir>/history.sqlite).") = None,
    executor: str = typer.Option("local", "--executor", help="Where the entries run: local (one after another, in this process) or ray (as Ray tasks; needs qconsist[ray])."),
    address: Optional[str] = typer.Option(None, "--address", help="ray: an existing Ray cluster (auto, HEAD:6379 or ray://HEAD:10001); default: a local Ray started in this process."),
    max_retries: int = typer.Option(2, "--max-retries", help="ray: how many times an entry whose worker was lost (killed, out of memory, node gone) runs again."),
    across_gpus: bool = typer.Option(False, "--across-gpus", help="Also compare each model run on several GPU types (gpus = [...]) across them: each type dumps it twice, in fresh sessions; the nodes that differ between the types, those that depend on the GPU type and those that vary from run to run."),
    order: Optional[str] = typer.Option(None, "--order", help="The order entries are handed out in: longest-first (by each entry's last duration in the history; entries with none first) or file. Default: longest-first with --executor ray, file with local."),
    json_output: opt.Json = False,
) -> None:
    """Run every model of FILE: pipeline, inference dumps, locate (where a GPU exists), the diff against the
    last good night on the same GPU type, driver and onnxruntime, and the gate; record everything in the
    history; write one HTML report. With --executor ray the entries (one per GPU type of an entry with
    gpus = [...]) run in parallel as Ray tasks; runs_dir must be a path every Ray node can reach.

    Exit 0: every gate passed; 1: a gate failed; 2: a model could not be judged or FILE is invalid;
    3: Ray is not installed or the cluster cannot be reached; 130: interrupted (the history stays consistent).
    """
    from qconsist.nightly import ExecutorOptions, load_nightly, run_nightly
    from qconsist.store.runs import default_history

    options = ExecutorOptions(name=executor, address=address, max_retries=max_retries)
    config = load_nightly(file)
    if runs_dir is not None:
        config = replace(config, runs_dir=runs_dir.resolve(), history=default_history(runs_dir, history).resolve())
    elif history is not None:
        config = replace(config, history=history.resolve())
    result = run_nightly(config, progress=progress_for(json_output), only=tuple(only or ()), executor=options,
                         across_gpus=across_gpus, order=order)
    if json_output:
        print_json(result)
    else:
        render_night(result)
    raise typer.Exit(result.exit_code)
