"""``qconsist inspect RUN|MODEL``: what a run directory or an ONNX model holds."""

from __future__ import annotations

from pathlib import Path

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return str(count)


def _model(console, summary, indent: str = "") -> None:  # summary: ModelSummary
    console.print(f"{indent}model {summary.path}: md5 {summary.md5}, {_size(summary.size)}, IR {summary.ir_version}, "
                  f"opset {summary.opsets.get('', summary.opsets.get('ai.onnx', '?'))}"
                  + (f", producer {summary.producer}" if summary.producer else ""))
    for kind, values in (("input", summary.inputs), ("output", summary.outputs)):
        for v in values:
            console.print(f"{indent}  {kind} {v.name}: {v.dtype} [{', '.join('?' if d is None else str(d) for d in v.shape)}]")
    console.print(f"{indent}  nodes {summary.nodes}: " + ", ".join(f"{op} {n}" for op, n in summary.ops.items()))
    console.print(f"{indent}  initializers {summary.initializers}: {summary.parameters} parameters, {_size(summary.initializer_bytes)}"
                  f" ({_size(summary.integer_weight_bytes)} as integers)")
    line = (f"{indent}  format {summary.format}: {summary.quantized_nodes} of {summary.computing_nodes} computing nodes run "
            f"quantized ({100 * summary.quantized_share:.1f}%)")
    if summary.format != "float" and summary.not_quantized:
        line += "; left in float: " + ", ".join(summary.not_quantized)
    console.print(line)


def _run(console, summary) -> None:  # summary: RunSummary
    verdict = "" if summary.verdict == "—" else f", verdict {summary.verdict}"
    console.print(f"run {summary.path}: {summary.kind}, {summary.status}{verdict}, {summary.started} → {summary.finished}")
    for problem in summary.problems:
        console.print(f"  modified: {problem}")
    console.print(f"  command: {summary.command}")
    if summary.model:
        console.print("  model: " + ", ".join(f"{k} {v}" for k, v in summary.model.items()))
    for stage in summary.stages:
        took = f" ({stage.seconds:.2f} s)" if isinstance(stage.seconds, (int, float)) else ""
        console.print(f"  stage {stage.name}: {stage.path or '-'}  md5 {stage.md5 or '-'}  sha256 {stage.sha256 or '-'}"
                      f"  content {stage.content or '-'}{took}")
        if stage.params:
            console.print("    " + ", ".join(f"{k}={v}" for k, v in stage.params.items() if not isinstance(v, (dict, list)) or v))
    for name, inputs in summary.inputs.items():
        console.print(f"  {name}: {inputs.get('source')} ×{inputs.get('count')} ({inputs.get('kind')}), digest {inputs.get('digest')}")
    if summary.options:
        console.print("  options: " + ", ".join(f"{k}={v}" for k, v in summary.options.items() if v not in (None, {}, [])))
    env = summary.environment
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
    console.print(f"  environment: {packages}; Python {env.get('python')}, {env.get('os')} {env.get('machine')}, "
                  f"{env.get('cpu')} ×{env.get('cpu_count')}" + (f", GPUs {env['gpus']}" if env.get("gpus") else "")
                  + (f", CUDA {env['cuda']}" if env.get("cuda") else ""))
    if summary.dump is not None:
        d = summary.dump
        console.print(f"  dump: {d.tensors} tensors at level {d.level}, faithful {d.faithful} ({d.samples_checked} samples checked), "
                      f"raw {d.raw_mode} ({d.raw_tensors} tensors kept), {_size(d.bytes)}")
    if summary.accuracy is not None:
        from qconsist.store.sections import Accuracy

        console.print(f"  accuracy: {Accuracy.from_json(summary.accuracy).describe()}")
    console.print(f"  sections: {', '.join(summary.sections) or '-'}; {summary.files} files, {_size(summary.bytes)}")
    if summary.stage_model is not None:
        _model(console, summary.stage_model, "  ")


def inspect(
    path: Path = typer.Argument(..., parser=opt.read_path, help="A run directory or an .onnx model."),
    stage: opt.Stage = None,
    json_output: opt.Json = False,
) -> None:
    """Show what a run holds (stages and their hashes, inputs, environment, options, dumps) or what a model holds
    (inputs, opset, ops by count, weights, quantized share). With --stage, also that stage's model.

    Exit 0, 2 error (no such run or model, an incomplete run).
    """
    from qconsist.inspect import ModelSummary, inspect_path

    summary = inspect_path(path, stage)
    if json_output:
        print_json(summary)
    elif isinstance(summary, ModelSummary):
        _model(stdout_console(), summary)
    else:
        _run(stdout_console(), summary)
