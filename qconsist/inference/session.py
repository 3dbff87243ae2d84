"""The one way qconsist makes an ONNX Runtime session, from typed execution options recorded as given.

``ExecutionOptions`` names everything that decides which kernels run: the execution provider and its options
(validated by the provider registry, ``qconsist.inference.provider``), the graph optimization level, the graph
transformers switched off (``disabled_optimizers``), intra-op threads and deterministic compute. ``None`` means
"onnxruntime's default" and is recorded as such.

``create_session`` is the only place that constructs ``onnxruntime.InferenceSession`` (through
``open_ort_session``): it checks the provider really runs on this machine, builds the session options, and
turns onnxruntime's errors into one line (``UnsupportedModelError``).

**onnxruntime's own log** (its C++ logger writes straight to descriptor 2, at session creation and during
``run``: the CUDA EP's "running in Fallback mode" warnings come from the first run) never reaches the terminal:
a session is made, and every call into it runs, inside ``ort_logged()``, which adds nothing where a capture is
already under way (a run directory's ``onnxruntime.log``, the CLI's capture of the whole command) and otherwise
captures the call itself and logs one summary line (``qconsist.store.ortlog``). ``create_session`` returns a
``Session``, which wraps onnxruntime's and routes its calls so; the tools of ``onnxruntime.quantization`` that
open their own sessions are called inside ``ort_logged()`` as well. The library's long operations (locate, its
latency timing, the fp16 analysis, the gate…) hold one ``ort_logged()`` around all their sessions: a call inside
one costs a counter, not a capture of its own (measured: about 65 µs per run otherwise, here). ``optimizer_log`` opens a session with
onnxruntime's verbose log captured, to read which graph transformers ran and which changed the graph. ``input_specs`` and ``run_outputs``
run a model over an input set for the stages' checks.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from qconsist.errors import ConfigError, OutputError, QconsistError, UnavailableError, UnsupportedModelError
from qconsist.inference.provider import ConvAlgoSearch, ProviderOption, ProviderSpec, provider_spec
from qconsist.inference.strides import with_multiples
from qconsist.inputs.inputset import InputSet, InputSpec
from qconsist.environment import fingerprint
from qconsist.limits import shorten
from qconsist.onnxfile import read_onnx
from qconsist.store.ortlog import OrtLog, capture_ort_log, capturing
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import serialized
from qconsist.threads import MEASUREMENT_THREADS

log = logging.getLogger(__name__)

__all__ = [
    "ConvAlgoSearch", "DeviceInfo", "ExecutionOptions", "MEASUREMENT", "OptimizationLevel", "Session", "create_session",
    "input_specs", "measurement_options", "onnxruntime_limits", "open_ort_session", "optimizer_log", "ort_logged",
    "ort_message", "outputs_of", "provider_available", "require_provider", "run_outputs", "sessions_opened",
]


class OptimizationLevel(str, Enum):
    DISABLE = "disable"
    BASIC = "basic"
    EXTENDED = "extended"
    ALL = "all"


def _level(value: Any) -> OptimizationLevel:
    if isinstance(value, OptimizationLevel):
        return value
    if isinstance(value, str):
        try:
            return OptimizationLevel(value.lower())
        except ValueError:
            pass
    raise ConfigError(f"graph_optimization_level {value!r} is not one of {', '.join(m.value for m in OptimizationLevel)}")


# The CUDA options as flat keyword arguments and JSON keys, as runs recorded them before providers became a
# registry; accepted by ``ExecutionOptions.from_json`` so older manifests still read.
_FLAT_CUDA = ("cudnn_conv_algo_search", "use_tf32", "cudnn_conv_use_max_workspace", "device_id")
_OPTIMIZER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_CONFIG_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+")
# The command-line flag of each execution option: the CLI's execution group declares its options with these
# names and ``ExecutionOptions.to_args`` writes them back. A provider option without a flag of its own
# travels as --provider-option KEY=VALUE; a boolean flag also has its --no- form.
FLAGS = {
    "provider": "--ep", "graph_optimization_level": "--level", "intra_op_threads": "--threads",
    "deterministic_compute": "--deterministic", "disabled_optimizers": "--disable-optimizer",
    "cudnn_conv_algo_search": "--cudnn-conv-algo-search", "use_tf32": "--tf32",
    "cudnn_conv_use_max_workspace": "--cudnn-max-workspace", "device_id": "--device-id",
    "provider_options": "--provider-option", "session_config": "--session-config",
}


# onnxruntime's SessionOptions defaults that qconsist resolves (use_deterministic_compute is off); the provider
# options' defaults are in the provider registry (``ProviderOption.default``)
SESSION_DEFAULTS = {"deterministic_compute": False}


def _switch(flag: str, on: bool) -> str:
    return flag if on else f"--no-{flag[2:]}"


MAX_THREADS = 1024  # intra-op threads: a fixed bound (a run recorded on a large machine replays on a small one)


@dataclass(frozen=True)
class ExecutionOptions:
    """How a model is executed. Validated on creation: the provider must be known and its options must be
    ones it takes, of the right type."""

    provider: str = "cpu"
    provider_options: Mapping[str, Any] = field(default_factory=dict)
    graph_optimization_level: OptimizationLevel = OptimizationLevel.ALL
    intra_op_threads: int | None = None  # None: onnxruntime's default (one per physical core)
    deterministic_compute: bool | None = None  # SessionOptions.use_deterministic_compute
    # graph transformers (or rewrite rules) switched off by name, sorted; onnxruntime ignores a name it does not have
    disabled_optimizers: tuple[str, ...] = ()
    # onnxruntime's session configuration entries (SessionOptions.add_session_config_entry), e.g.
    # session.disable_quant_qdq = "1"; sorted by key; onnxruntime ignores a key it does not have
    session_config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        spec = provider_spec(self.provider)
        object.__setattr__(self, "provider", spec.name)
        object.__setattr__(self, "graph_optimization_level", _level(self.graph_optimization_level))
        given = {name: value for name, value in dict(self.provider_options or {}).items() if value is not None}
        unknown = sorted(set(given) - set(spec.options))
        if unknown:
            known = ", ".join(spec.options) or "none"
            raise ConfigError(f"execution provider {spec.name} takes no option {', '.join(unknown)} (its options: {known})")
        parsed = {name: spec.options[name].parse(spec.name, name, value) for name, value in given.items()}
        object.__setattr__(self, "provider_options", MappingProxyType(dict(sorted(parsed.items()))))
        value = self.intra_op_threads
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"intra_op_threads must be a non-negative integer, got {value!r}")
        if value is not None and value > MAX_THREADS:
            raise ConfigError(f"intra_op_threads {value} is more than {MAX_THREADS}, the most qconsist starts (each thread "
                              "takes memory; past the cores they only wait): give at most the machine's cores, or 0 for "
                              "onnxruntime's default")
        if self.deterministic_compute is not None and not isinstance(self.deterministic_compute, bool):
            raise ConfigError(f"deterministic_compute must be true or false, got {self.deterministic_compute!r}")
        names = self.disabled_optimizers
        if isinstance(names, str) or not all(isinstance(n, str) and _OPTIMIZER_NAME.fullmatch(n) for n in names or ()):
            raise ConfigError(f"`disabled_optimizers` must be graph transformer names such as ConstantFolding, got {names!r}")
        object.__setattr__(self, "disabled_optimizers", tuple(sorted(set(names or ()))))
        object.__setattr__(self, "session_config", MappingProxyType(_session_config(self.session_config)))

    def _key(self) -> tuple:
        return (self.provider, tuple(self.provider_options.items()), self.graph_optimization_level,
                self.intra_op_threads, self.deterministic_compute, self.disabled_optimizers,
                tuple(self.session_config.items()))

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExecutionOptions):
            return NotImplemented
        return self._key() == other._key()

    def option(self, name: str) -> Any:
        """A provider option's value, ``None`` when not given (onnxruntime's default applies)."""
        return self.provider_options.get(name)

    def setting(self, name: str) -> Any:
        """The value in effect of a provider option or a session field: the one given, else onnxruntime's default
        (``None`` where qconsist does not know it: onnxruntime decides). ORT's defaults are resolved here only."""
        options = provider_spec(self.provider).options
        if name in options:
            value = self.provider_options.get(name)
            return options[name].default if value is None else value
        if name in {f.name for f in fields(self)} - {"provider", "provider_options"}:
            value = getattr(self, name)
            return SESSION_DEFAULTS.get(name) if value is None else value
        raise ConfigError(f"execution provider {self.provider} has no setting {name}")

    def with_options(self, **changes: Any) -> "ExecutionOptions":
        """A copy with provider options set (``None`` removes one) or session fields changed."""
        session_fields = {f.name for f in fields(self)} - {"provider", "provider_options"}
        options = dict(self.provider_options)
        session: dict[str, Any] = {}
        for key, value in changes.items():
            if key in session_fields:
                session[key] = value
            elif value is None:
                options.pop(key, None)
            else:
                options[key] = value
        return replace(self, provider_options=options, **session)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ExecutionOptions":
        data = dict(data)
        if "ep" in data:  # the flat form of runs recorded before the provider registry
            provider = data.pop("ep")
            options = {k: data.pop(k) for k in _FLAT_CUDA if k in data}
            data = {**data, "provider": provider, "provider_options": {k: v for k, v in options.items() if v is not None}}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"execution options: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        data = {
            "provider": self.provider,
            "provider_options": {k: v.value if isinstance(v, Enum) else v for k, v in self.provider_options.items()},
            "graph_optimization_level": self.graph_optimization_level.value,
            "intra_op_threads": self.intra_op_threads, "deterministic_compute": self.deterministic_compute,
        }
        if self.disabled_optimizers:  # written only when set, so runs recorded before the field read the same
            data["disabled_optimizers"] = list(self.disabled_optimizers)
        if self.session_config:  # likewise
            data["session_config"] = dict(self.session_config)
        return data

    def to_args(self) -> list[str]:
        """The command-line flags that give these options (``qconsist run`` takes them back as they are)."""
        args = [FLAGS["provider"], self.provider, FLAGS["graph_optimization_level"], self.graph_optimization_level.value]
        if self.intra_op_threads is not None:
            args += [FLAGS["intra_op_threads"], str(self.intra_op_threads)]
        if self.deterministic_compute is not None:
            args.append(_switch(FLAGS["deterministic_compute"], self.deterministic_compute))
        for name in self.disabled_optimizers:
            args += [FLAGS["disabled_optimizers"], name]
        for key, value in self.session_config.items():
            args += [FLAGS["session_config"], f"{key}={value}"]
        for key, value in self.to_json()["provider_options"].items():
            if key not in FLAGS:
                args += [FLAGS["provider_options"], f"{key}={value}"]
            elif isinstance(value, bool):
                args.append(_switch(FLAGS[key], value))
            else:
                args += [FLAGS[key], str(value)]
        return args

    def ort_providers(self) -> list[Any]:
        """onnxruntime's ``providers`` argument: this provider with its options as strings, then its fallback."""
        spec = provider_spec(self.provider)
        options = {k: ProviderOption.to_ort(v) for k, v in self.provider_options.items()}
        return [(spec.ort_name, options) if options else spec.ort_name, *spec.fallback]


def _session_config(entries: Any) -> dict[str, str]:
    """Session configuration entries as onnxruntime takes them: dotted keys, string values (a boolean is "1" or
    "0", a number its decimal text), sorted by key."""
    if not isinstance(entries, Mapping):
        raise ConfigError(f"`session_config` must be a table of KEY = VALUE entries, got {entries!r}")
    checked = {}
    for key, value in entries.items():
        if not isinstance(key, str) or not _CONFIG_KEY.fullmatch(key):
            raise ConfigError(f"`session_config` key {key!r} is not an onnxruntime configuration key such as "
                              "session.disable_quant_qdq")
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, int) or (isinstance(value, float) and value == value):
            value = str(value)
        if not isinstance(value, str):
            raise ConfigError(f"`session_config` {key}: the value must be text or a number, got {value!r}")
        checked[key] = value
    return dict(sorted(checked.items()))


def measurement_options(options: ExecutionOptions = ExecutionOptions()) -> ExecutionOptions:
    """``options`` for a session qconsist opens to measure something itself (a stage check, calibration, a
    reference): onnxruntime's default intra-op thread count (one per physical core, which changes the CPU
    provider's last bits) becomes ``MEASUREMENT_THREADS`` (``qconsist.threads``); a count given stays."""
    if options.intra_op_threads is not None:
        return options
    return options.with_options(intra_op_threads=MEASUREMENT_THREADS)


# The CPU with graph optimizations on, one intra-op thread: the stages' checks and the gate's outputs.
MEASUREMENT = measurement_options()


def ort_level(level: OptimizationLevel):  # -> ort.GraphOptimizationLevel
    import onnxruntime as ort

    return {
        OptimizationLevel.DISABLE: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        OptimizationLevel.BASIC: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        OptimizationLevel.EXTENDED: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        OptimizationLevel.ALL: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]


def ort_message(exc: BaseException) -> str:
    """onnxruntime's error text without its error-code prefix and C++ source location."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"^Load model from .*? failed:\s*", "", text)
    return _without_source_locations(text) or type(exc).__name__


_SOURCE_LOCATION = re.compile(r"/\S+\.(?:cc|cpp|cu|h|hpp):\d+ ")


def _without_source_locations(text: str) -> str:
    """onnxruntime's ``/onnxruntime_src/…/file.cc:266 <C++ signature>(…) `` prefixes removed, wherever they are."""
    while match := _SOURCE_LOCATION.search(text):
        start, end = match.start(), match.end()
        opening = text.find("(", end)
        if opening < 0:
            break
        depth, index = 0, opening
        while index < len(text):
            depth += {"(": 1, ")": -1}.get(text[index], 0)
            if depth == 0:
                break
            index += 1
        text = text[:start] + text[index + 1:].lstrip()
    return text


_shared_lock = threading.Lock()
_shared_depth = 0
_shared: tuple[ExitStack, OrtLog] | None = None  # the capture of the outermost ort_logged(), while one is open


def _close_shared() -> None:
    global _shared
    (stack, record), _shared = _shared, None  # type: ignore[misc]
    stack.close()
    if record.lines:
        first = f"; first: {record.first}" if record.first else ""
        counts = (f"{record.warnings} warning(s), {record.errors} error(s)" if record.warnings or record.errors
                  else f"{record.lines} line(s)")
        (log.warning if record.warnings or record.errors else log.debug)(f"onnxruntime logged {counts}{first}")
        log.debug("onnxruntime's log:\n%s", record.text.rstrip())


@contextmanager
def ort_logged() -> Iterator[None]:
    """onnxruntime's C++ log (descriptor 2) captured while the block runs. Where a capture is already under way
    (a run directory's, the CLI's) the block adds nothing; otherwise the block's log is counted and summarized in
    one logged line (a warning where onnxruntime warned). Shared by threads: the capture ends when the last
    block does."""
    global _shared_depth, _shared
    with _shared_lock:
        if _shared_depth == 0 and not capturing():
            stack = ExitStack()
            _shared = (stack, stack.enter_context(capture_ort_log(None)))
        _shared_depth += 1
    try:
        yield
    finally:
        with _shared_lock:
            _shared_depth -= 1
            if _shared_depth == 0 and _shared is not None:
                _close_shared()


class Session:
    """An ``onnxruntime.InferenceSession`` whose every call runs inside ``ort_logged()`` (its attributes and
    other methods are onnxruntime's: ``get_inputs``, ``get_outputs``, ``io_binding``, ``get_providers`` …)."""

    def __init__(self, session: Any) -> None:
        self._session = session

    @property
    def ort_session(self) -> Any:
        """onnxruntime's own session object."""
        return self._session

    def run(self, *args: Any, **kwargs: Any) -> Any:
        with ort_logged():
            return self._session.run(*args, **kwargs)

    def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
        with ort_logged():
            return self._session.run_with_iobinding(*args, **kwargs)

    def run_with_ort_values(self, *args: Any, **kwargs: Any) -> Any:
        with ort_logged():
            return self._session.run_with_ort_values(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@functools.lru_cache(maxsize=1)
def probe_model() -> bytes:
    """A one-node model (Relu on 4 floats), to ask onnxruntime what it can run."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def open_ort_session(
    model: str | Path | bytes,
    options: ExecutionOptions,
    *,
    level: OptimizationLevel | None = None,
    optimized_model_filepath: Path | None = None,
    disabled_optimizers: Sequence[str] = (),
    fallback: bool = True,
    log_verbose: bool = False,
    spinning: bool = True,
) -> Session:
    """The one ``onnxruntime.InferenceSession`` construction (no availability check, no error translation),
    made inside ``ort_logged()`` and returned as a ``Session``. ``spinning`` False: the intra-op threads sleep
    when idle instead of spinning (``session.intra_op.allow_spinning=0``; which kernels run, and how the work is
    split between threads, do not change)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort_level(level or options.graph_optimization_level)
    if options.intra_op_threads is not None:
        so.intra_op_num_threads = options.intra_op_threads
    if options.deterministic_compute is not None:
        so.use_deterministic_compute = options.deterministic_compute
    for key, value in options.session_config.items():
        so.add_session_config_entry(key, value)
    if optimized_model_filepath is not None:
        so.optimized_model_filepath = str(optimized_model_filepath)
    if log_verbose:
        so.log_severity_level = 0
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = options.ort_providers() if fallback else options.ort_providers()[:1]
    source = model if isinstance(model, bytes) else str(model)
    disabled = sorted({*options.disabled_optimizers, *disabled_optimizers})
    kwargs = {"disabled_optimizers": disabled} if disabled else {}
    with ort_logged():
        session = Session(ort.InferenceSession(source, so, providers=providers, **kwargs))
    with _OPENED_LOCK:
        _OPENED[0] += 1
    return session


_OPENED = [0]  # sessions this process has made through ``open_ort_session``
_OPENED_LOCK = threading.Lock()


def sessions_opened() -> int:
    """How many onnxruntime sessions this process has made through qconsist so far (a command's cost in sessions
    is the difference; the sessions onnxruntime's quantization tools make for themselves are not counted)."""
    with _OPENED_LOCK:
        return _OPENED[0]


def create_session(
    model: str | Path | bytes,
    options: ExecutionOptions = ExecutionOptions(),
    *,
    level: OptimizationLevel | None = None,
    optimized_model_filepath: Path | None = None,
    disabled_optimizers: Sequence[str] = (),
    spinning: bool = True,
) -> Session:
    """An onnxruntime session of ``model`` (a path or serialized bytes) run as ``options`` say.

    ``level`` overrides the options' optimization level (the dump reloads ORT's optimized graph with
    optimizations off); ``optimized_model_filepath`` makes ORT save the graph it optimized;
    ``disabled_optimizers`` names graph transformers to switch off besides the options' own; ``spinning``
    False lets its idle intra-op threads sleep (the dump's session, which shares the cores with the fingerprint
    worker and production: ``open_ort_session``). Raises
    ``UnavailableError`` when the provider cannot run here, ``UnsupportedModelError`` (one line) when onnxruntime cannot load the model.
    """
    require_provider(options.provider)
    check_disabled_optimizers(model, options)
    try:
        session = open_ort_session(model, options, level=level, optimized_model_filepath=optimized_model_filepath,
                                   disabled_optimizers=disabled_optimizers, spinning=spinning)
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidGraph / InvalidArgument / … types
        raise _load_failure(model, options, exc, level, optimized_model_filepath, disabled_optimizers) from None
    ort_name = provider_spec(options.provider).ort_name
    if ort_name not in session.get_providers():
        raise UnavailableError(f"onnxruntime fell back from {ort_name} to {', '.join(session.get_providers())}")
    return session


def optimizer_log(
    model: str | Path | bytes,
    options: ExecutionOptions = ExecutionOptions(),
    *,
    level: OptimizationLevel | None = None,
    optimized_model_filepath: Path | None = None,
    disabled_optimizers: Sequence[str] = (),
) -> str:
    """onnxruntime's verbose log of creating a session of ``model`` as ``options`` say: the graph transformers
    it applies, level by level, and whether each changed the graph ("GraphTransformer X modified: 1").

    The log is onnxruntime's own, read from its C++ logger (file descriptor 2, redirected while the session is
    made). Errors as ``create_session``'s."""

    import onnxruntime as ort

    require_provider(options.provider)
    # descriptor 2 is the process's: one capture at a time, or two threads' captures take each other's lines and
    # the one that ends last puts the other's file back as stderr (start-up parts run beside production's session)
    with _OPTIMIZER_LOG, scratch_dir("qconsist-ortlog-") as folder:
        path = Path(folder) / "ort.log"
        try:
            with capture_ort_log(path):
                open_ort_session(model, options, level=level, optimized_model_filepath=optimized_model_filepath,
                                 disabled_optimizers=disabled_optimizers, log_verbose=True)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
            where = "the model" if isinstance(model, bytes) else str(model)
            raise UnsupportedModelError(f"onnxruntime {ort.__version__} cannot load {where}: {ort_message(exc)}") from None
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


# onnxruntime's rewrite rules (run inside its rule-based transformers, so its log never names them) that
# ``disabled_optimizers`` also takes; the graph transformers themselves are read from the installed onnxruntime's log
REWRITE_RULES = frozenset({
    "CastChainElimination", "CastElimination", "ClipQuantFusion", "ConvAddFusion", "ConvBNFusion", "ConvMulFusion",
    "DivMulFusion", "EliminateDropout", "EliminateIdentity", "EliminateSlice", "ExpandElimination", "FuseReluClip",
    "GemmSumFusion", "GemmTransposeFusion", "LabelEncoderFusion", "MatmulBNFusion", "NoopElimination", "NotWhereFusion",
    "PadFusion", "PreShapeNodeElimination", "ReluQuantFusion", "UnsqueezeElimination",
})
_TRANSFORMER = re.compile(r"(?:Applying graph transformer|GraphTransformer) (\S+)(?: on step| modified)")
_KNOWN_OPTIMIZERS: dict[tuple[str, str], frozenset[str]] = {}
_OPTIMIZER_LOG = threading.Lock()  # optimizer_log's capture of descriptor 2
_KNOWN_LOCK = threading.Lock()  # known_optimizers' cache: one verbose session per model, whatever thread asks


def known_optimizers(model: str | Path | bytes, options: ExecutionOptions = ExecutionOptions()) -> frozenset[str]:
    """The names ``disabled_optimizers`` can switch off for ``model`` with this onnxruntime: every graph
    transformer its log shows at level ``all`` (one verbose session, once per model and provider), and the
    rewrite rules (``REWRITE_RULES``)."""
    key = (hashlib.sha256(model).hexdigest() if isinstance(model, bytes) else os.path.realpath(model), options.provider)
    with _KNOWN_LOCK:
        if key not in _KNOWN_OPTIMIZERS:
            plain = replace(options, disabled_optimizers=(), graph_optimization_level=OptimizationLevel.ALL)
            _KNOWN_OPTIMIZERS[key] = frozenset(_TRANSFORMER.findall(optimizer_log(model, plain))) | REWRITE_RULES
        return _KNOWN_OPTIMIZERS[key]


def check_disabled_optimizers(model: str | Path | bytes, options: ExecutionOptions) -> None:
    """A name in ``options.disabled_optimizers`` that onnxruntime does not have (which it would ignore, and the run
    record as disabled) is an error listing the ones it has."""
    if not options.disabled_optimizers:
        return
    known = known_optimizers(model, options)
    unknown = [name for name in options.disabled_optimizers if name not in known]
    if unknown:
        raise ConfigError(f"--disable-optimizer {shorten(unknown[0], 60)}: onnxruntime has no graph transformer or rewrite "
                          f"rule of that name (it would ignore it); known for this model: {', '.join(sorted(known))}")


def _load_failure(model: str | Path | bytes, options: ExecutionOptions, exc: BaseException, level: OptimizationLevel | None,
                  optimized_model_filepath: Path | None, disabled_optimizers: Sequence[str]) -> QconsistError:
    """Why onnxruntime could not make a session, in one line that blames what is at fault: a graph with no
    output (nothing to run), the write of the optimized graph (a full disk: onnxruntime says only "Protobuf
    serialization failed", so the session is made again without the write: if that works, the write failed),
    else the model, in onnxruntime's words."""
    import onnxruntime as ort

    where = "the model" if isinstance(model, bytes) else str(model)
    outputs = _graph_outputs(model)
    if outputs == 0:
        return empty_graph_error(where)
    if optimized_model_filepath is not None:
        try:
            open_ort_session(model, options, level=level, disabled_optimizers=disabled_optimizers)
        except Exception:  # noqa: BLE001 - the model itself does not load: said below
            pass
        else:
            return OutputError(f"cannot write onnxruntime's optimized graph to {optimized_model_filepath}: "
                               f"{_write_failure(Path(optimized_model_filepath), ort_message(exc))}")
    return UnsupportedModelError(f"onnxruntime {ort.__version__} cannot load {where}: {ort_message(exc)}")


def empty_graph_error(where: str) -> UnsupportedModelError:
    """The one line for a model whose graph declares no output."""
    return UnsupportedModelError(f"{where} has an empty graph: it declares no output, so there is nothing to run")


def _graph_outputs(model: str | Path | bytes) -> int | None:
    """How many outputs the model's graph declares (None: unreadable)."""
    import onnx

    try:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else read_onnx(model)
    except Exception:  # noqa: BLE001 - onnx raises DecodeError, OSError, ValueError…
        return None
    return len(proto.graph.output)


def _write_failure(path: Path, said: str) -> str:
    """Why a file could not be written: the space left where it goes, measured now."""
    folder = path.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return f"the write failed ({said})"
    if free < (1 << 20):
        return f"the disk is full ({free} bytes free in {folder}; onnxruntime said: {said})"
    return f"the write failed ({said}; {free >> 20} MiB free in {folder})"


@serialized
@dataclass(frozen=True)
class DeviceInfo:
    """What ``require_provider`` found: the provider, onnxruntime's providers, the device's name."""

    provider: str
    providers: tuple[str, ...]
    name: str


def _device_name(spec: ProviderSpec) -> str:

    if spec.name == "cpu":
        return str(fingerprint().get("cpu") or "CPU")
    gpus = fingerprint().get("gpus") or []
    return gpus[0]["name"] if gpus else "unknown GPU"


@functools.lru_cache(maxsize=None)
def require_provider(name: str) -> DeviceInfo:
    """The provider is in this onnxruntime and really runs a one-node model; else ``UnavailableError``.

    Answered once per process, by running: onnxruntime-gpu lists the CUDA provider whenever it is installed,
    even where no GPU or no CUDA library is present, and then quietly falls back to the CPU."""
    import onnxruntime as ort

    spec = provider_spec(name)
    available = tuple(ort.get_available_providers())
    if spec.preload is not None:
        spec.preload()
    if spec.ort_name not in available:
        raise UnavailableError(
            f"execution provider {spec.name} ({spec.ort_name}) is not in this onnxruntime "
            f"(available: {', '.join(available)}); for cuda install onnxruntime-gpu (qconsist[gpu]) on a machine with an NVIDIA GPU"
        )
    if spec.name != "cpu":
        try:
            session = open_ort_session(probe_model(), ExecutionOptions(spec.name), fallback=False)
            session.run(None, {"x": np.arange(4, dtype=np.float32)})
        except UnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure here means the device cannot be used
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UnavailableError(f"execution provider {spec.name} failed to start ({first})") from None
        if session.get_providers()[0] != spec.ort_name:
            raise UnavailableError(
                f"execution provider {spec.name} is not usable: onnxruntime fell back to the CPU "
                "(CUDA or cuDNN libraries not found, or no GPU)"
            )
    return DeviceInfo(spec.name, available, _device_name(spec))


def provider_available(name: str) -> bool:
    try:
        require_provider(name)
    except UnavailableError:
        return False
    return True


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint64)": np.uint64, "tensor(uint32)": np.uint32, "tensor(uint16)": np.uint16, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


_FED = {np.dtype(t) for t in _ORT_TYPES.values()}


def records_type(ort_type: str) -> bool:
    """Whether qconsist feeds and records a tensor of this onnxruntime type (``tensor(float)``…): not the float8,
    int4, bfloat16 or string tensors onnxruntime returns in forms numpy does not hold as themselves."""
    return ort_type in _ORT_TYPES


def input_specs(session: Any) -> list[InputSpec]:
    """The inputs of a model as qconsist feeds them (the one ``input_specs``): a session's as it reports them; a
    model file's read from its graph (milliseconds) where it reads and every input is of a type qconsist feeds,
    else from a session on the CPU, whose error names what is wrong; for a model file, the sizes an input with a
    dynamic height and width takes (``strides.spatial_multiple``)."""
    if isinstance(session, (str, Path)):
        try:
            specs = graph_input_specs(Path(session))
        except QconsistError:
            specs = None
        if specs is not None and all(np.dtype(s.dtype) in _FED for s in specs):
            return specs
    path = Path(session) if isinstance(session, (str, Path)) else None
    if isinstance(session, (str, Path, bytes)):
        session = create_session(session)
    specs = []
    for item in session.get_inputs():
        if item.type not in _ORT_TYPES:
            raise UnsupportedModelError(f"model input '{item.name}' has type {item.type}, which qconsist cannot feed")
        specs.append(InputSpec(name=item.name, dtype=np.dtype(_ORT_TYPES[item.type]), shape=tuple(item.shape)))
    return with_multiples(specs, lambda: _load_graph(path)) if path is not None else specs


def graph_input_specs(path: Path) -> list[InputSpec]:
    """The graph inputs of the model file at ``path`` (initializers excluded), as declared (any type)."""
    import onnx

    model = read_onnx(path)
    if not model.graph.output:
        raise empty_graph_error(str(path))
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type") or tensor.elem_type == onnx.TensorProto.UNDEFINED:
            kind = value.type.WhichOneof("value") or "value of no type"
            raise UnsupportedModelError(f"model input '{value.name}' is a {kind.replace('_type', '')}, which qconsist cannot feed")
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)), dims))
    return with_multiples(specs, lambda: model)


def _load_graph(model: str | Path | bytes) -> Any:
    import onnx  # only for a model with a dynamic height and width

    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return read_onnx(model)


@ort_logged()  # one capture for all its sessions and runs
def run_outputs(session: Any, inputs: InputSet, batch_size: int = 1,
                specs: list[InputSpec] | None = None) -> list[dict[str, np.ndarray]]:
    """Every step's outputs (``batch_size`` samples stacked), by output name, in input order."""
    checked = inputs.checked(specs if specs is not None else input_specs(session), batch_size)
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, step))) for _, step in checked.batches(batch_size)]


def outputs_of(path: Path, inputs: InputSet, options: ExecutionOptions = MEASUREMENT,
               batch_size: int = 1) -> list[dict[str, np.ndarray]]:
    """The model's outputs on ``inputs``, by default as qconsist's checks measure them (``MEASUREMENT``)."""
    session = create_session(path, options)
    return run_outputs(session, inputs, batch_size, with_multiples(input_specs(session), lambda: _load_graph(path)))


def onnxruntime_limits() -> tuple[int | None, int | None]:
    """The newest ai.onnx opset and IR version the installed onnxruntime loads, found by asking it."""
    import onnx

    def loads(opset: int, ir_version: int) -> bool:
        model = onnx.load_from_string(probe_model())
        del model.opset_import[:]
        model.opset_import.add(domain="", version=opset)
        model.ir_version = ir_version
        try:
            open_ort_session(model.SerializeToString(), ExecutionOptions())
        except Exception:  # noqa: BLE001 - onnxruntime raises its own Fail / InvalidGraph types
            return False
        return True

    if not loads(13, 7):
        return None, None
    opset = 13
    while opset < 64 and loads(opset + 1, 7):
        opset += 1
    ir = 7
    while ir < 64 and loads(13, ir + 1):
        ir += 1
    return opset, ir
