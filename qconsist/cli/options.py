"""Options that several commands take, declared once: one flag, one meaning, one help text everywhere.

Grouped as Polygraphy's ``tools/args`` are: each group's options, and the function that builds the library
object from them (``execution_options``, ``input_set``). A command lists the options it takes with these
types; ``tests/cli/test_options.py`` checks that no two commands give one flag two meanings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

# --- paths ----------------------------------------------------------------------------------------------------


def read_path(text: str) -> Path:
    """A path a command reads, as given, or the file a ``package:<module>/<file>`` path names (the one resolver:
    ``qconsist.inputs.package``)."""
    from qconsist.inputs.package import resolve_path

    return resolve_path(text)


PACKAGE_PATHS = " A file inside an installed package can be given as package:<module>/<file>."

# --- output ---------------------------------------------------------------------------------------------------
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON (schema-versioned; no progress, no colours).")]
RunsDir = Annotated[Optional[Path], typer.Option("--runs-dir", help="Where run directories go (default: ./runs, or a pipeline or nightly file's runs_dir).")]
RunId = Annotated[Optional[str], typer.Option("--run-id", help="Name of the run directory (default: <name>-<UTC time>-<random>).")]
Force = Annotated[bool, typer.Option("--force", help="Do what is refused by default: write an output file over an existing file, an input or a file inside a run directory; remove a run the history names as a baseline (runs rm).")]
History = Annotated[Optional[Path], typer.Option("--history", help="History database (default: the nightly file's history, else <runs_dir>/history.sqlite; report: none, give it to write the history page).")]

# --- model and inputs -------------------------------------------------------------------------------------------
ModelArg = Annotated[Path, typer.Argument(parser=read_path, help="An .onnx file, or a run directory (its --stage artifact)." + PACKAGE_PATHS)]
Stage = Annotated[Optional[str], typer.Option("--stage", help="Which stage's artifact of a run directory (default: quantize).")]
INPUTS_HELP = ("The input set: package:photos, a folder of images (flat, with an optional labels file, or one subfolder "
               "per class), a .npy/.npz file, a folder of .npy, or package:<module>/<path>.")
Inputs = Annotated[str, typer.Option("--inputs", help=INPUTS_HELP)]
Offset = Annotated[int, typer.Option("--offset", help="First sample of the input set.")]
Count = Annotated[Optional[int], typer.Option("--count", help="How many samples from --offset (default: all; locate: 8).")]
Workers = Annotated[Optional[int], typer.Option("--workers", min=0, help="Input workers decoding and preparing samples ahead of the model (default: the cores available, fewer for small sets; 1: one thread; 0: none, one sample after the other). The tensors are the same whatever the count.")]
LabelsFile = Annotated[Optional[Path], typer.Option("--labels", parser=read_path, help="Labels of the input set's images: JSON {name: class}, CSV file,label or text lines 'file label' (default: a class-folder set's folders, or a labels.csv/json/txt beside the images).")]
PipelineFile = Annotated[Optional[Path], typer.Option("--pipeline", parser=read_path, help="Pipeline file whose [preprocess] prepares images (and, for locate, whose [quantize] and [calibration] serve --calibration-repeats).")]

# --- execution ------------------------------------------------------------------------------------------------
Ep = Annotated[str, typer.Option("--ep", help="Execution provider: cpu or cuda.")]
Level = Annotated[str, typer.Option("--level", help="Graph optimization level: disable, basic, extended, all.")]
Threads = Annotated[Optional[int], typer.Option("--threads", min=0, help="Intra-op threads (default: onnxruntime's).")]
Deterministic = Annotated[Optional[bool], typer.Option("--deterministic/--no-deterministic", help="SessionOptions.use_deterministic_compute (default: onnxruntime's).")]
ALGO_SEARCH_HELP = ("cuda: cudnn_conv_algo_search, EXHAUSTIVE, HEURISTIC or DEFAULT (default: onnxruntime's; "
                    "locate: repeatable, the modes to explore, default all three).")
AlgoSearch = Annotated[Optional[str], typer.Option("--cudnn-conv-algo-search", help=ALGO_SEARCH_HELP)]
AlgoSearches = Annotated[List[str], typer.Option("--cudnn-conv-algo-search", help=ALGO_SEARCH_HELP)]
Tf32 = Annotated[Optional[bool], typer.Option("--tf32/--no-tf32", help="cuda: use_tf32 on or off (default: onnxruntime's; locate: both).")]
MaxWorkspace = Annotated[Optional[bool], typer.Option("--cudnn-max-workspace/--no-cudnn-max-workspace", help="cuda: cudnn_conv_use_max_workspace (default: onnxruntime's).")]
DeviceId = Annotated[Optional[int], typer.Option("--device-id", min=0, help="cuda: device_id (default: 0).")]
DisableOptimizers = Annotated[List[str], typer.Option("--disable-optimizer", help="Switch off one of onnxruntime's graph transformers by name, e.g. QDQSelectorActionTransformer (repeatable; qconsist explain names them).")]
ProviderOptions = Annotated[List[str], typer.Option("--provider-option", help="Any option of the execution provider as KEY=VALUE (repeatable), e.g. use_tf32=0.")]
OUTPUT_HELP = "The file to write (report: the HTML page; convert: the ONNX model, written only once every check passed)."
PolicyFile = Annotated[Optional[Path], typer.Option("--policy", parser=read_path, help="Policy file (TOML; default: the built-in defaults, see policies/default.toml): gate checks and tolerances; diff takes its [diff] tolerances (atol, rtol, per node), --atol/--rtol override them.")]
DynamicBatch = Annotated[bool, typer.Option("--dynamic-batch", help="Make the model take any batch size: its first input and output dimension becomes 'batch' (run: a model with a fixed batch is re-stamped and checked against the original on a real sample, then recorded; convert: the converted model, as [convert] dynamic_batch).")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Samples per step, stacked on the batch axis (default 1): run as the evaluation runs, since cuDNN picks algorithms per shape.")]
Engines = Annotated[bool, typer.Option("--engines/--no-engines", help="cuda: record the cuDNN engine of every convolution per run, from cuDNN's API log in a child session of the same model, options and input (run: off by default, diff shows them; locate: on, per config).")]
EngineRuns = Annotated[int, typer.Option("--engine-runs", help="With --engines: runs of the recording session (default 3).")]
Warmup = Annotated[int, typer.Option("--warmup", help="Latency: warm-up runs after the first one.")]
TimedRuns = Annotated[int, typer.Option("--timed-runs", help="Latency: timed runs (median and spread).")]
Top = Annotated[int, typer.Option("--top", min=1, help="How many nodes to print (--json has all).")]
Repeats = Annotated[int, typer.Option("--repeats", "-n", "-k", help="How many times the work is repeated and compared (calib repeat: calibrations, default 3; locate: fresh sessions per config, default 4).")]


def provider_options(
    ep: str, algo_search: str | None = None, tf32: bool | None = None, max_workspace: bool | None = None,
    device_id: int | None = None, extra: list[str] | None = None,
) -> dict[str, object]:
    """The provider options the execution flags give (validated by ``ExecutionOptions``)."""
    from qconsist.errors import ConfigError

    options: dict[str, object] = {
        "cudnn_conv_algo_search": algo_search, "use_tf32": tf32, "cudnn_conv_use_max_workspace": max_workspace,
        "device_id": device_id,
    }
    for item in extra or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"`provider_option` {item!r}: write KEY=VALUE, e.g. use_tf32=0")
        options[key.strip()] = value.strip()
    return {k: v for k, v in options.items() if v is not None}


def execution_options(
    ep: str, level: str = "all", threads: int | None = None, deterministic: bool | None = None,
    algo_search: str | None = None, tf32: bool | None = None, max_workspace: bool | None = None,
    device_id: int | None = None, extra: list[str] | None = None, disabled: list[str] | None = None,
):  # -> ExecutionOptions
    """The execution group's object."""
    from qconsist.inference.session import ExecutionOptions

    return ExecutionOptions(
        ep, provider_options(ep, algo_search, tf32, max_workspace, device_id, extra),
        graph_optimization_level=level, intra_op_threads=threads, deterministic_compute=deterministic,
        disabled_optimizers=tuple(disabled or ()),
    )


def input_set(inputs: str, source, pipeline: Path | None, offset: int = 0, count: int | None = None,
              batch_size: int = 1, workers: int | None = None, labels: Path | None = None):  # -> InputSet
    """The inputs group's object: the input set, prepared as the pipeline file (or the source run) says,
    labelled, sliced, checked against the model's inputs, and read by ``workers`` input workers."""
    from qconsist.errors import ConfigError
    from qconsist.inference.model import model_input_specs
    from qconsist.inputs import open_input_set
    from qconsist.inputs.preprocess import Preprocess

    if offset < 0:
        raise ConfigError(f"`offset` must be >= 0, got {offset}")
    if count is not None and count < 1:
        raise ConfigError(f"`count` must be >= 1, got {count}")
    specs = model_input_specs(source.path)
    if not specs:
        raise ConfigError(f"model {source.path} has no inputs")
    if pipeline is not None:
        from qconsist.pipeline.config import load_pipeline

        preprocess = load_pipeline(pipeline).preprocess
    else:
        found = source.preprocess_json()
        preprocess = None if found is None else Preprocess.from_dict(
            {k: v for k, v in found.items() if v is not None}, where="run manifest preprocess")
    selected = open_input_set(inputs, preprocess, specs[0].name, labels)
    if offset or count is not None:
        selected = selected.subset(offset, count)
    return selected.checked(specs, batch_size).with_workers(workers)
