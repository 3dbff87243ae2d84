"""``qconsist run``: inference of a model on an input set, optionally with a faithful tensor dump."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import note_ort_log, print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED

if TYPE_CHECKING:
    from qconsist.inference.session import ExecutionOptions
    from qconsist.inputs.options import InputOptions


@opt.uses(execution=opt.EXECUTION, inputs=opt.INPUTS, runs_dir=opt.RUNS)
def run(
    model: opt.ModelArg,
    *,
    stage: opt.Stage = None,
    inputs: InputOptions,
    execution: ExecutionOptions,
    dump: bool = typer.Option(False, "--dump", help="Fingerprint every tensor ORT computes, checked against production."),
    raw: str = typer.Option("none", "--raw", help="Raw tensors to keep with --dump: none, all, auto, or NODE,NODE,..."),
    fingerprints: str = typer.Option("auto", "--fingerprints", help="Where --dump fingerprints tensors: device (CUDA EP: on the GPU, needs qconsist[gpu]), host, or auto (device on the CUDA EP when CuPy is installed, else host with a warning)."),
    reference: Optional[Path] = typer.Option(None, "--reference", help="With --raw auto: keep the tensors that differ from this dump run."),
    batch_size: opt.BatchSize = 1,
    dynamic_batch: opt.told(opt.DynamicBatch, more="A model with a fixed batch is re-stamped and checked against the original on a real sample, then recorded.") = False,
    engines: opt.told(opt.Engines, more="Default: off; diff shows them.") = False,
    engine_runs: opt.EngineRuns = 3,
    runs_dir: Path,
    run_id: opt.RunId = None,
    json_output: opt.Json = False,
    isa: opt.Isa = None,
) -> None:
    """Run a model on an input set and write an inference run directory (outputs, options, environment).

    With --isa MODEL the run happens in a child process under QEMU user mode emulating that CPU model, and
    records its instruction set as the run's environment.

    Exit 0 done; 1 the dump was not faithful; 2 error; 3 the execution provider cannot run here (or --isa
    without QEMU).
    """
    if isa is not None:
        from qconsist.cli.emulated import reexec_under

        if reexec_under(isa, quiet=json_output):
            return
    entered = time.perf_counter()  # the process so far: the interpreter, the command line's imports, its options
    from qconsist.inference import RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inference.startup import Startup
    from qconsist.pipeline.inputs import open_inputs

    from qconsist import cli

    startup = Startup(entered, getattr(cli, "IMPORTED", None))
    startup.mark("imports")
    request = RunRequest(options=execution, dump=dump, raw=RawSelection.parse(raw), reference=reference,
                         batch_size=batch_size, dynamic_batch=dynamic_batch, engines=engines,
                         engine_runs=engine_runs, fingerprints=fingerprints)
    source = resolve_model(model, stage)
    startup.mark("model")
    # the inputs are opened (a folder listed, its first sample checked) while the run makes its session
    result = run_inference(source, lambda: open_inputs(inputs, source, batch_size if not dynamic_batch else 1), request,
                           runs_dir, run_id=run_id, command=sys.argv, progress=progress_for(json_output),
                           startup=startup)
    _render(result, json_output)
    if result.dump is not None and not result.dump.faithful:
        _warn_unfaithful(result.dump)
        raise typer.Exit(EXIT_DIVERGED)


def _render(result, json_output: bool) -> None:  # result: InferenceResult
    if json_output:
        print_json(result)
    else:
        console = stdout_console()
        console.print(f"run {result.run_dir}  ({result.samples} samples, {result.ms_per_sample:.1f} ms per sample)")
        if result.dump is not None:
            d = result.dump
            beside = ", beside production" if d.beside_production else ""
            console.print(f"dump: {d.tensors} tensors of ORT's optimized graph, {d.ms_per_sample:.1f} ms per sample "
                          f"(fingerprints on the {d.fingerprints_on}{beside}, {d.hash_function})")
            if d.faithful:
                console.print(f"dump faithful: final outputs bit-identical to production in {d.samples_checked} samples")
        if result.accuracy is not None:
            console.print(f"accuracy: {result.accuracy.describe()}")
        note_ort_log(result.onnxruntime_log)


def _warn_unfaithful(d) -> None:  # d: the dump's summary
    from qconsist.inference.runner import PRODUCTION_REPEATS

    if d.production_distinct and d.production_distinct > 1:
        sys.stderr.write(
            f"warning: final outputs of {len(d.mismatched_samples)}/{d.samples_checked} samples differ from "
            f"production, and production itself varies from run to run (sample {d.mismatched_samples[0]}: "
            f"{d.production_distinct} distinct outputs in {PRODUCTION_REPEATS} runs): a non-deterministic "
            "kernel, which `qconsist locate` names; no dump can match it bit for bit\n"
        )
    else:
        sys.stderr.write(
            f"warning: dump NOT faithful: final outputs of {len(d.mismatched_samples)}/{d.samples_checked} "
            f"samples differ from production (max abs diff {d.max_abs_diff})\n"
        )
