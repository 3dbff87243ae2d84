"""``qconsist run``: inference of a model on an input set, optionally with a faithful tensor dump."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from qconsist.cli.app import app, handles_errors, print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED, ConfigError


def _preprocess(pipeline: Path | None, source):  # -> Preprocess | None
    from qconsist.inputs.preprocess import Preprocess

    if pipeline is not None:
        from qconsist.pipeline.config import load_pipeline

        return load_pipeline(pipeline).preprocess
    found = source.preprocess_json()
    if found is None:
        return None
    return Preprocess.from_dict({k: v for k, v in found.items() if v is not None}, where="run manifest preprocess")


@app.command("run")
@handles_errors
def run(
    model: Path = typer.Argument(..., help="An .onnx file, or a run directory (its --stage artifact)."),
    inputs: str = typer.Option(..., "--inputs", help="Folder of images, .npy/.npz file, folder of .npy, or package:photos."),
    stage: Optional[str] = typer.Option(None, "--stage", help="Stage of a run directory to run (default: quantize)."),
    pipeline: Optional[Path] = typer.Option(None, "--pipeline", help="Pipeline file whose [preprocess] prepares images."),
    ep: str = typer.Option("cpu", "--ep", help="Execution provider: cpu or cuda."),
    level: str = typer.Option("all", "--level", help="Graph optimization level: disable, basic, extended, all."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Intra-op threads (default: onnxruntime's)."),
    deterministic: Optional[bool] = typer.Option(None, "--deterministic/--no-deterministic", help="SessionOptions.use_deterministic_compute."),
    algo: Optional[str] = typer.Option(None, "--cudnn-conv-algo-search", help="CUDA: EXHAUSTIVE, HEURISTIC or DEFAULT."),
    tf32: Optional[bool] = typer.Option(None, "--tf32/--no-tf32", help="CUDA: use_tf32 on or off."),
    workspace: Optional[bool] = typer.Option(None, "--cudnn-max-workspace/--no-cudnn-max-workspace", help="CUDA: cudnn_conv_use_max_workspace."),
    device_id: Optional[int] = typer.Option(None, "--device-id", help="CUDA: device id."),
    dump: bool = typer.Option(False, "--dump", help="Fingerprint every tensor ORT computes, checked against production."),
    raw: str = typer.Option("none", "--raw", help="Raw tensors to keep with --dump: none, all, auto, or NODE,NODE,..."),
    reference: Optional[Path] = typer.Option(None, "--reference", help="With --raw auto: keep the tensors that differ from this dump run."),
    offset: int = typer.Option(0, "--offset", help="First sample of the input set."),
    count: Optional[int] = typer.Option(None, "--count", help="Number of samples (default: all)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run directories go."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run directory (default: generated)."),
    json_output: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run a model on an input set and write an inference run directory (outputs, options, environment)."""
    from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inference.model import input_specs
    from qconsist.inputs import open_input_set

    options = ExecutionOptions(
        ep=ep, graph_optimization_level=level, intra_op_threads=threads, deterministic_compute=deterministic,
        cudnn_conv_algo_search=algo, use_tf32=tf32, cudnn_conv_use_max_workspace=workspace, device_id=device_id,
    )
    request = RunRequest(options=options, dump=dump, raw=RawSelection.parse(raw), reference=reference)
    source = resolve_model(model, stage)
    specs = input_specs(source.path)
    if not specs:
        raise ConfigError(f"model {source.path} has no inputs")
    input_set = open_input_set(inputs, _preprocess(pipeline, source), specs[0].name)
    if offset or count is not None:
        input_set = input_set.subset(offset, count)
    input_set = input_set.checked(specs)
    result = run_inference(
        source, input_set, request, runs_dir, run_id=run_id, command=sys.argv, progress=progress_for(json_output),
    )
    if json_output:
        print_json(result.to_json())
    else:
        console = stdout_console()
        console.print(f"run {result.run_dir}  ({result.samples} samples, {result.ms_per_sample:.1f} ms per sample)")
        if result.dump is not None:
            d = result.dump
            console.print(f"dump: {d['tensors']} tensors of ORT's optimized graph, {d['ms_per_sample']:.1f} ms per sample")
            if d["faithful"]:
                console.print(f"dump faithful: final outputs bit-identical to production in {d['samples_checked']} samples")
    if result.dump is not None and not result.dump["faithful"]:
        d = result.dump
        sys.stderr.write(
            f"warning: dump NOT faithful: final outputs of {len(d['mismatched_samples'])}/{d['samples_checked']} "
            f"samples differ from production (max abs diff {d['max_abs_diff']})\n"
        )
        raise typer.Exit(EXIT_DIVERGED)
