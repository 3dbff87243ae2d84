"""The top level: the main job from Python in one import, ``import qconsist``.

Each call does what its command does and returns the same result object (``docs/python-api.md``):

- ``qconsist.pipeline_run(file)``: ``qconsist pipeline run`` → ``PipelineResult``
- ``qconsist.run(model, inputs, ...)``: ``qconsist run`` → ``InferenceResult``
- ``qconsist.diff(run_a, run_b)``: ``qconsist diff`` → ``DiffResult``
- ``qconsist.quant_error(run)``: ``qconsist quant-error`` → ``QuantErrorResult``
- ``qconsist.gate(run, baseline)``: ``qconsist gate`` → ``GateVerdict``
- ``qconsist.calib_repeat(source, repeats)``: ``qconsist calib repeat`` → ``RepeatResult``

Arguments are the commands' options by their Python names, with the same defaults; paths may be ``str``.
``progress=True`` prints a line every 10 s of work on stderr (``qconsist.progress.ProgressLines``); a
``Progress`` object of your own is taken as it is. The library otherwise never prints.

The imports are inside the calls, on purpose: ``import qconsist`` (which the command line does first) stays
as light as the CLI's ``--help`` needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["calib_repeat", "diff", "gate", "pipeline_run", "quant_error", "run"]


def _progress(progress: Any):  # -> Progress
    from qconsist.progress import NULL_PROGRESS, ProgressLines

    if progress is True:
        return ProgressLines()
    return progress or NULL_PROGRESS


def _execution(ep: str, level: str, threads: int | None, options: Any):  # -> ExecutionOptions
    from qconsist.inference import ExecutionOptions

    if options is not None:
        return options
    return ExecutionOptions(ep, graph_optimization_level=level, intra_op_threads=threads)


def pipeline_run(file: str | Path, *, runs_dir: str | Path | None = None, run_id: str | None = None,
                 progress: Any = False):  # -> PipelineResult
    """Run every stage of a pipeline file into a new run directory (``qconsist pipeline run FILE``)."""
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    return run_pipeline(load_pipeline(Path(file)), runs_dir=Path(runs_dir) if runs_dir is not None else None,
                        run_id=run_id, progress=_progress(progress))


def run(model: str | Path, inputs: str, *, stage: str | None = None, pipeline: str | Path | None = None,
        offset: int = 0, count: int | None = None, labels: str | Path | None = None, ep: str = "cpu",
        level: str = "all", threads: int | None = None, options: Any = None, dump: bool = False, raw: str = "none",
        batch_size: int = 1, runs_dir: str | Path | None = None, run_id: str | None = None,
        progress: Any = False):  # -> InferenceResult
    """Run a model (an .onnx file, or a run directory's ``stage``) on an input set and write an inference run
    (``qconsist run MODEL --inputs SRC``). ``options``: an ``ExecutionOptions`` in place of ``ep``, ``level``,
    ``threads``; ``dump=True`` fingerprints every tensor (``--dump``); images of a run directory are prepared as
    its pipeline prepares them."""
    from qconsist.inference import RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inputs import InputOptions
    from qconsist.pipeline.inputs import open_inputs
    from qconsist.store.runs import default_runs_dir

    source = resolve_model(Path(model), stage)
    chosen = InputOptions(str(inputs), Path(pipeline) if pipeline is not None else None, offset, count, None,
                          Path(labels) if labels is not None else None)
    input_set = open_inputs(chosen, source, batch_size)
    request = RunRequest(options=_execution(ep, level, threads, options), dump=dump, raw=RawSelection.parse(raw),
                         batch_size=batch_size)
    return run_inference(source, input_set, request, default_runs_dir(Path(runs_dir) if runs_dir is not None else None),
                         run_id=run_id, progress=_progress(progress))


def diff(run_a: str | Path, run_b: str | Path, *, atol: float | None = None, rtol: float | None = None):  # -> DiffResult
    """Compare two runs (``qconsist diff RUN_A RUN_B``): exact by default; with ``atol``/``rtol``, which nodes
    differ by more than that."""
    from qconsist.compare.tolerance import Tolerance
    from qconsist.diff import diff_runs

    if atol is None and rtol is None:
        return diff_runs(Path(run_a), Path(run_b))
    return diff_runs(Path(run_a), Path(run_b), Tolerance(atol=atol or 0.0, rtol=rtol or 0.0))


def quant_error(run: str | Path, inputs: str | None = None, *, pipeline: str | Path | None = None, offset: int = 0,
                count: int | None = None, ep: str = "cpu", level: str = "all", threads: int | None = None,
                options: Any = None, float_stage: str = "optimize", float_level: str = "disable",
                progress: Any = False):  # -> QuantErrorResult
    """Rank the nodes of a pipeline run's quantized model by their error against its float model (``qconsist
    quant-error RUN``), on ``inputs`` (prepared as the run's pipeline prepares images; None: the run's own
    evaluation inputs, sliced by ``offset`` and ``count``)."""
    from qconsist.diff.quantization import quantization_error
    from qconsist.inference import resolve_model
    from qconsist.inputs import InputOptions
    from qconsist.pipeline.inputs import open_inputs
    from qconsist.sensitivity.source import open_quantized_run

    source = resolve_model(Path(run), None)
    if inputs is None:
        evaluation = open_quantized_run(source.run.path if source.run is not None else Path(run)).inputs("evaluation")
        input_set = evaluation.subset(offset, count) if offset or count is not None else evaluation
    else:
        chosen = InputOptions(str(inputs), Path(pipeline) if pipeline is not None else None, offset, count)
        input_set = open_inputs(chosen, source)
    return quantization_error(source.run or Path(run), input_set, _execution(ep, level, threads, options),
                              float_stage=float_stage, quantized_stage=source.stage or "quantize",
                              float_level=float_level, progress=_progress(progress))


def gate(run: str | Path, baseline: str | Path | None = None, *, policy: str | Path | None = None,
         progress: Any = False):  # -> GateVerdict
    """Judge a pipeline run or nightly entry against its baseline under a policy (``qconsist gate RUN``;
    ``policy`` None: the built-in defaults)."""
    from qconsist.gate import evaluate_gate, load_policy

    return evaluate_gate(Path(run), Path(baseline) if baseline is not None else None,
                         load_policy(Path(policy) if policy is not None else None), progress=_progress(progress))


def calib_repeat(source: str | Path, repeats: int = 3, *, progress: Any = False):  # -> RepeatResult
    """Calibrate and quantize a pipeline file's model ``repeats`` times on the same inputs and compare the
    quantized models (``qconsist calib repeat FILE``)."""
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import repeat_from_pipeline

    return repeat_from_pipeline(load_pipeline(Path(source)), repeats, _progress(progress))
