"""Options that several commands take, declared once: one flag, one meaning, one help text everywhere.

Grouped as Polygraphy's ``tools/args`` are: a ``Group`` holds its options and builds the library object from
them (``EXECUTION`` an ``ExecutionOptions``, ``INPUTS`` an ``InputOptions``, ``RUNS`` the runs directory). A
command names the object it wants as a parameter and the group with ``@uses(execution=EXECUTION)``: the group's
options take that parameter's place in the command's signature, and the command is called with the object, so
no command lists a group's members. Single options shared by commands are the ``Annotated`` types below;
``tests/cli/test_options.py`` checks that no two commands give one flag two meanings.

Each option says what it does for the command that shows it, and nothing about other commands: a command whose
use of a shared option differs (its default, what it reads from a file) gives it its own help with ``told``
(one option) or ``Group.told`` (a group's member); the first clause, the flag's meaning, stays the same
(``tests/cli/test_help.py`` runs every ``--help`` and fails on an option named that the command lacks). Options
are shown in panels as Polygraphy groups its arguments: ``Model``, ``Inputs``, ``Execution``, ``Output``, then
the command's own (``app.PanelCommand``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, List, Optional

import typer

# --- paths ----------------------------------------------------------------------------------------------------


def read_path(text: str) -> Path:
    """A path a command reads, as given, or the file a ``package:<module>/<file>`` path names (the one resolver:
    ``qconsist.inputs.package``)."""
    from qconsist.inputs.package import resolve_path

    return resolve_path(text)


PACKAGE_PATHS = " A file inside an installed package can be given as package:<module>/<file>."

# --- output ---------------------------------------------------------------------------------------------------
MODEL, INPUTS_PANEL, EXECUTION_PANEL, OUTPUT = "Model", "Inputs", "Execution", "Output"
PANELS = (MODEL, INPUTS_PANEL, EXECUTION_PANEL, OUTPUT)  # shown in this order, after the command's own options
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON (schema-versioned; no progress, no colours).", rich_help_panel=OUTPUT)]
RunsDir = Annotated[Optional[Path], typer.Option("--runs-dir", help="Where run directories go (default: ./runs, or a pipeline or nightly file's runs_dir).", rich_help_panel=OUTPUT)]
RunId = Annotated[Optional[str], typer.Option("--run-id", help="Name of the run directory (default: <name>-<UTC time>-<random>).", rich_help_panel=OUTPUT)]
Force = Annotated[bool, typer.Option("--force", help="Do what is refused by default: write an output file over an existing file, an input or a file inside a run directory.", rich_help_panel=OUTPUT)]
History = Annotated[Optional[Path], typer.Option("--history", help="History database (default: <runs_dir>/history.sqlite).")]

# --- model and inputs -------------------------------------------------------------------------------------------
ModelArg = Annotated[Path, typer.Argument(parser=read_path, help="An .onnx file, or a run directory (its --stage artifact)." + PACKAGE_PATHS)]
Stage = Annotated[Optional[str], typer.Option("--stage", help="Which stage's artifact of a run directory (default: quantize).", rich_help_panel=MODEL)]
INPUTS_HELP = ("The input set: package:photos, a folder of images (flat, with an optional labels file, or one subfolder "
               "per class), a .npy/.npz file, a folder of .npy, a folder of .npz (one sample each, fed exactly), "
               "or package:<module>/<path>.")
Inputs = Annotated[str, typer.Option("--inputs", help=INPUTS_HELP, rich_help_panel=INPUTS_PANEL)]
Offset = Annotated[int, typer.Option("--offset", help="First sample of the input set.", rich_help_panel=INPUTS_PANEL)]
Count = Annotated[Optional[int], typer.Option("--count", help="How many samples from --offset (default: all).", rich_help_panel=INPUTS_PANEL)]
Workers = Annotated[Optional[int], typer.Option("--workers", min=0, help="Input workers decoding and preparing samples ahead of the model (default: the cores available, fewer for small sets; 1: one thread; 0: none, one sample after the other). The tensors are the same whatever the count.", rich_help_panel=INPUTS_PANEL)]
LabelsFile = Annotated[Optional[Path], typer.Option("--labels", parser=read_path, help="Labels of the input set's images: JSON {name: class}, CSV file,label or text lines 'file label' (default: a class-folder set's folders, or a labels.csv/json/txt beside the images).", rich_help_panel=INPUTS_PANEL)]
PipelineFile = Annotated[Optional[Path], typer.Option("--pipeline", parser=read_path, help="Pipeline file whose [preprocess] prepares images.", rich_help_panel=INPUTS_PANEL)]

# --- execution ------------------------------------------------------------------------------------------------
Ep = Annotated[str, typer.Option("--ep", help="Execution provider: cpu or cuda.", rich_help_panel=EXECUTION_PANEL)]
Level = Annotated[str, typer.Option("--level", help="Graph optimization level: disable, basic, extended, all.", rich_help_panel=EXECUTION_PANEL)]
Threads = Annotated[Optional[int], typer.Option("--threads", min=0, help="Intra-op threads (default: onnxruntime's).", rich_help_panel=EXECUTION_PANEL)]
Deterministic = Annotated[Optional[bool], typer.Option("--deterministic/--no-deterministic", help="SessionOptions.use_deterministic_compute (default: onnxruntime's).", rich_help_panel=EXECUTION_PANEL)]
ALGO_SEARCH_HELP = "cuda: cudnn_conv_algo_search, EXHAUSTIVE, HEURISTIC or DEFAULT (default: onnxruntime's)."
AlgoSearch = Annotated[Optional[str], typer.Option("--cudnn-conv-algo-search", help=ALGO_SEARCH_HELP, rich_help_panel=EXECUTION_PANEL)]
AlgoSearches = Annotated[List[str], typer.Option("--cudnn-conv-algo-search", rich_help_panel=EXECUTION_PANEL,
                                                 help="cuda: cudnn_conv_algo_search, EXHAUSTIVE, HEURISTIC or DEFAULT (repeatable: the modes to explore; default: all three).")]
Tf32 = Annotated[Optional[bool], typer.Option("--tf32/--no-tf32", help="cuda: use_tf32 on or off (default: onnxruntime's).", rich_help_panel=EXECUTION_PANEL)]
MaxWorkspace = Annotated[Optional[bool], typer.Option("--cudnn-max-workspace/--no-cudnn-max-workspace", help="cuda: cudnn_conv_use_max_workspace (default: onnxruntime's).", rich_help_panel=EXECUTION_PANEL)]
DeviceId = Annotated[Optional[int], typer.Option("--device-id", min=0, help="cuda: device_id (default: 0).", rich_help_panel=EXECUTION_PANEL)]
Isa = Annotated[Optional[str], typer.Option("--isa", help="Run under another instruction set: a QEMU CPU model (haswell: AVX2 without VNNI; nehalem: SSE4.2, no AVX; `qemu-x86_64 -cpu help` lists them), in a child process under QEMU user mode (package qemu-user), whose run records the emulated instruction set; much slower (docs/numerics.md). native (the default): this processor. `qconsist locate --ep cpu` and `qconsist calib repeat` take a comma-separated list (locate's default: native,Haswell,Nehalem).", rich_help_panel=EXECUTION_PANEL)]
DisableOptimizers = Annotated[List[str], typer.Option("--disable-optimizer", help="Switch off one of onnxruntime's graph transformers by name, e.g. QDQSelectorActionTransformer (repeatable; qconsist explain names them).", rich_help_panel=EXECUTION_PANEL)]
SessionConfig = Annotated[List[str], typer.Option("--session-config", help="One of onnxruntime's session configuration entries as KEY=VALUE (repeatable), e.g. session.disable_quant_qdq=1; recorded with the run.", rich_help_panel=EXECUTION_PANEL)]
ProviderOptions = Annotated[List[str], typer.Option("--provider-option", help="Any option of the execution provider as KEY=VALUE (repeatable), e.g. use_tf32=0.", rich_help_panel=EXECUTION_PANEL)]
Output = Annotated[Path, typer.Option("-o", "--output", help="The file to write.", rich_help_panel=OUTPUT)]
PolicyFile = Annotated[Optional[Path], typer.Option("--policy", parser=read_path, help="Policy file (TOML; default: the built-in defaults, see policies/default.toml): its checks and tolerances.")]
DynamicBatch = Annotated[bool, typer.Option("--dynamic-batch", help="Make the model take any batch size: its first input and output dimension becomes 'batch'.")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Samples per step, stacked on the batch axis (default 1): run as the evaluation runs, since cuDNN picks algorithms per shape.", rich_help_panel=EXECUTION_PANEL)]
Engines = Annotated[bool, typer.Option("--engines/--no-engines", help="cuda: record the cuDNN engine of every convolution per run, from cuDNN's API log in a child session of the same model, options and input.", rich_help_panel=EXECUTION_PANEL)]
EngineRuns = Annotated[int, typer.Option("--engine-runs", help="With --engines: runs of the recording session (default 3).", rich_help_panel=EXECUTION_PANEL)]
Warmup = Annotated[int, typer.Option("--warmup", help="Latency: warm-up runs after the first one.")]
TimedRuns = Annotated[int, typer.Option("--timed-runs", help="Latency: timed runs (median and spread).")]
Top = Annotated[int, typer.Option("--top", min=1, help="How many nodes to print (--json has all).")]
Repeats = Annotated[int, typer.Option("--repeats", "-n", "-k", help="How many times the work is repeated and compared.")]


def told(annotation: Any, help: str | None = None, *, more: str | None = None, panel: str | None = "") -> Any:
    """``annotation``'s option with this command's help: ``help`` in place of the shared text, or ``more`` after it
    (``panel``: another help panel; None: the command's own options)."""
    base, info = typing.get_args(annotation)
    info = copy.copy(info)
    if panel != "":
        info.rich_help_panel = panel
    if help is not None:
        info.help = help
    if more is not None:
        info.help = f"{info.help} {more}"
    return Annotated[base, info]


# --- groups that build their objects ---------------------------------------------------------------------------


class Group:
    """Options declared once with the object they build: ``members`` maps each parameter name to its
    ``(annotation, default)``; ``build`` takes them as keywords and returns the object."""

    def __init__(self, build: Callable[..., Any], **members: tuple[Any, Any]) -> None:
        self.build = build
        self.members = members

    def with_defaults(self, **defaults: Any) -> "Group":
        """The same group where a command's defaults differ (``locate``: ``--ep cuda``, ``--count 8``)."""
        unknown = set(defaults) - set(self.members)
        if unknown:
            raise TypeError(f"the group has no option {', '.join(sorted(unknown))}")
        members = {name: (annotation, defaults.get(name, default)) for name, (annotation, default) in self.members.items()}
        return Group(self.build, **members)

    def told(self, **helps: str) -> "Group":
        """The same group where a command tells what a member does for it (``locate``'s ``--pipeline`` also
        serves its ``--calibration-repeats``): each value replaces the member's help."""
        unknown = set(helps) - set(self.members)
        if unknown:
            raise TypeError(f"the group has no option {', '.join(sorted(unknown))}")
        members = {name: (told(annotation, helps[name]) if name in helps else annotation, default)
                   for name, (annotation, default) in self.members.items()}
        return Group(self.build, **members)

    def parameters(self) -> list[inspect.Parameter]:
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
                for name, (annotation, default) in self.members.items()]


def uses(**groups: Group) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the objects of ``groups``: each named parameter of the command is replaced, in the
    signature typer reads, by the group's options; the command is called with the object the group built."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        missing = set(groups) - set(signature.parameters)
        if missing:
            raise TypeError(f"{command.__name__} has no parameter {', '.join(sorted(missing))}")
        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            found = groups.get(parameter.name)
            if found:  # the object's own annotation is for readers (and type checkers) only
                parameters += found.parameters()
                continue
            annotation = parameter.annotation  # typer reads the annotations as objects
            if isinstance(annotation, str):
                annotation = eval(annotation, command.__globals__)  # noqa: S307 - the module's own annotation
            parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=annotation))

        @functools.wraps(command)
        def with_groups(**values: Any) -> Any:
            for name, group in groups.items():
                values[name] = group.build(**{member: values.pop(member) for member in group.members})
            return command(**values)

        with_groups.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        with_groups.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_groups

    return decorate


def _provider_options(algo_search: str | None, tf32: bool | None, max_workspace: bool | None, device_id: int | None,
                      provider_option: list[str]) -> dict[str, object]:
    """The provider options the execution flags give (validated by ``ExecutionOptions``)."""
    from qconsist.errors import ConfigError

    options: dict[str, object] = {
        "cudnn_conv_algo_search": algo_search, "use_tf32": tf32, "cudnn_conv_use_max_workspace": max_workspace,
        "device_id": device_id,
    }
    for item in provider_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"`provider_option` {item!r}: write KEY=VALUE, e.g. use_tf32=0")
        options[key.strip()] = value.strip()
    return {k: v for k, v in options.items() if v is not None}


def _execution(ep: str, level: str, threads: int | None, deterministic: bool | None, algo_search: str | None,
               tf32: bool | None, max_workspace: bool | None, device_id: int | None, provider_option: list[str],
               disabled_optimizers: list[str], session_config: list[str]):  # -> ExecutionOptions
    from qconsist.errors import ConfigError
    from qconsist.inference.session import ExecutionOptions

    entries = {}
    for item in session_config:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"`session_config` {item!r}: write KEY=VALUE, e.g. session.disable_quant_qdq=1")
        entries[key.strip()] = value.strip()
    return ExecutionOptions(
        ep, _provider_options(algo_search, tf32, max_workspace, device_id, provider_option),
        graph_optimization_level=level, intra_op_threads=threads, deterministic_compute=deterministic,
        disabled_optimizers=tuple(disabled_optimizers), session_config=entries,
    )


EXECUTION = Group(
    _execution, ep=(Ep, "cpu"), level=(Level, "all"), threads=(Threads, None), deterministic=(Deterministic, None),
    algo_search=(AlgoSearch, None), tf32=(Tf32, None), max_workspace=(MaxWorkspace, None), device_id=(DeviceId, None),
    provider_option=(ProviderOptions, []), disabled_optimizers=(DisableOptimizers, []),
    session_config=(SessionConfig, []),
)


def _inputs(inputs: str, pipeline: Path | None, offset: int, count: int | None, workers: int | None,
            labels: Path | None):  # -> InputOptions
    from qconsist.inputs.options import InputOptions

    return InputOptions(inputs, pipeline, offset, count, workers, labels)


INPUTS = Group(_inputs, inputs=(Inputs, ...), pipeline=(PipelineFile, None), offset=(Offset, 0), count=(Count, None),
               workers=(Workers, None), labels=(LabelsFile, None))


def _runs(runs_dir: Path | None) -> Path:
    from qconsist.store.runs import default_runs_dir

    return default_runs_dir(runs_dir)


RUNS = Group(_runs, runs_dir=(RunsDir, None))
