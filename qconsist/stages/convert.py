"""Stage convert: Caffe (prototxt + caffemodel) → ONNX with caffe2onnx, then qconsist's own repair pass.

1. Refuse, naming the layer, what cannot be converted faithfully (``check_supported``).
2. caffe2onnx converts copies of the network rewritten onto code paths of it that work (``normalize.py``).
3. The opset and IR version are re-stamped (caffe2onnx stamps the installed onnx's newest, which
   onnxruntime refuses) with ``ConvertOptions.opset`` (default 17) and its IR version.
4. ``repair.py`` gives every layer's nodes Caffe's exact semantics; each repair is recorded.
5. ``onnx.checker`` (full check), then, unless ``check=False``, onnxruntime's output against the numpy
   Caffe reference on a seeded input (``fidelity.py``): outside tolerance raises ``FidelityError``.
"""

from __future__ import annotations

import re
import shutil
import contextlib
import io
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter

from qconsist.errors import ConfigError, FidelityError, InputError, UnsupportedModelError
from qconsist.onnxfile import ai_onnx_opset, read_onnx
from qconsist.stages.caffe.fidelity import FidelityCheck, check_fidelity
from qconsist.stages.calibration_table import quantized_nodes
from qconsist.stages.caffe.proto import caffe_pb2, read_caffemodel, read_prototxt
from qconsist.stages.caffe.geometry import onnx_pool_pads, pool_geometry, pooled_size
from qconsist.stages.caffe.geometry import blob_array
from qconsist.stages.caffe.geometry import infer_shapes, layers_of
from qconsist.stages.caffe.normalize import prepare
from qconsist.stages.caffe.reference import weights_by_layer
from qconsist.stages.caffe.repair import repair_model
from qconsist.store.atomic import write_bytes_atomic
from qconsist.compare import compare_outputs
from qconsist.inference.model import with_dynamic_batch
from qconsist.inference.session import MEASUREMENT, create_session, onnxruntime_limits, outputs_of
from qconsist.tomlfile import guard
from qconsist.stages.base import StageRecord
from qconsist.store.atomic import write_atomic
from qconsist.store.hashing import hash_artifact
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

# opset → the IR version onnx.helper pairs with it (onnx.helper.VERSION_TABLE).
SUPPORTED_OPSETS = (13, 14, 15, 16, 17, 18, 19, 20, 21)
DEFAULT_OPSET = 17

# Caffe layer types whose conversion qconsist checks numerically (tests/stages/test_convert_layers.py).
SUPPORTED_LAYERS = frozenset({
    "Input", "Convolution", "Deconvolution", "BatchNorm", "Scale", "Pooling", "ReLU", "PReLU", "Eltwise",
    "InnerProduct", "Concat", "Softmax", "Dropout", "Flatten", "Reshape", "Crop",
})


@serialized
@dataclass(frozen=True)
class ConvertOptions:
    """``opset``: a Caffe model's converted opset (``None``: ``DEFAULT_OPSET``); an ONNX entry's opset upgrade
    (``None``: the model's own), through ``onnx.version_converter``. ``check``: compare with the numpy Caffe
    reference on a seeded input, or the upgraded ONNX entry with the original on the evaluation inputs."""

    opset: int | None = None
    dynamic_batch: bool = False
    check: bool = True

    def __post_init__(self) -> None:
        for name in ("dynamic_batch", "check"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"convert.{name} must be true or false, got {getattr(self, name)!r}")
        if self.opset is not None and (isinstance(self.opset, bool) or not isinstance(self.opset, int)
                                       or self.opset not in SUPPORTED_OPSETS):
            raise ConfigError(
                f"convert.opset {self.opset} is not supported; choose one of {', '.join(map(str, SUPPORTED_OPSETS))}"
            )

    @property
    def caffe_opset(self) -> int:
        return DEFAULT_OPSET if self.opset is None else self.opset


@serialized
@dataclass
class ConvertResult:
    path: Path
    opset: int
    ir_version: int
    seconds: float  # the whole stage, check included
    repairs: list[str] = field(default_factory=list)
    check: FidelityCheck | None = None  # None when ConvertOptions.check is False
    convert_seconds: float = 0.0  # without the check

    @property
    def passed(self) -> bool:
        return self.check is None or self.check.passed

    def __bool__(self) -> bool:
        return self.passed


def ir_version_for(opset: int) -> int:
    for entry in onnx.helper.VERSION_TABLE:
        # (release, ir_version, ai.onnx opset, ai.onnx.ml opset[, training opset])
        if entry[2] == opset:
            return entry[1]
    raise ConfigError(f"onnx does not know opset {opset}")


# blobs each layer type reads from the caffemodel: (required count, optional extra when bias_term)
_BLOBS = {"Convolution": 1, "Deconvolution": 1, "InnerProduct": 1, "Scale": 1, "PReLU": 1, "BatchNorm": 3}


def _refuse(layer, reason: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"layer '{layer.name}' ({layer.type}): {reason}")


def _check_layer(layer, shapes: dict, saved: dict) -> None:
    bottoms = [shapes[(layer.name, b)] for b in layer.bottom if (layer.name, b) in shapes]
    if len(layer.include) or len(layer.exclude):
        raise _refuse(layer, "has include/exclude phase rules; keep only the TEST-phase layers in the deploy prototxt")
    if layer.type in ("Convolution", "Deconvolution", "Pooling") and any(len(b) != 4 for b in bottoms):
        raise _refuse(layer, f"needs a 4-D (N, C, H, W) bottom, got {[list(b) for b in bottoms]}")
    if layer.type in ("Convolution", "Deconvolution") and layer.convolution_param.axis != 1:
        raise _refuse(layer, f"axis {layer.convolution_param.axis} is not supported (only channels at axis 1)")
    if layer.type == "Pooling":
        _check_pooling(layer, bottoms[0])
    if layer.type == "BatchNorm" and layer.batch_norm_param.HasField("use_global_stats") and not layer.batch_norm_param.use_global_stats:
        raise _refuse(layer, "use_global_stats: false normalises each batch with its own statistics, which ONNX "
                             "inference cannot; set it to true to use the stored statistics")
    if layer.type == "Scale" and len(layer.bottom) != 1:
        raise _refuse(layer, "takes its scale from a second bottom; only learned Scale blobs are supported")
    if layer.type == "Eltwise":
        param = layer.eltwise_param
        if len(param.coeff) and param.operation != 1:
            raise _refuse(layer, "coefficients are only allowed with operation SUM")
        if len(param.coeff) and len(param.coeff) != len(layer.bottom):
            raise _refuse(layer, f"has {len(param.coeff)} coefficients for {len(layer.bottom)} bottoms")
    if layer.type in _BLOBS:
        _check_blobs(layer, saved.get(layer.name))


def _check_pooling(layer, bottom) -> None:
    param = layer.pooling_param
    if param.pool == 2:
        raise _refuse(layer, "STOCHASTIC pooling has no ONNX equivalent")
    if param.global_pooling:
        return
    geo = pool_geometry(param, bottom[2], bottom[3])
    for axis, size in enumerate(bottom[2:]):
        k, p, s = geo["kernel"][axis], geo["pad"][axis], geo["stride"][axis]
        if k <= 0 or s <= 0 or p >= k:
            raise _refuse(layer, f"kernel {k}, pad {p}, stride {s}: Caffe needs kernel > 0, stride > 0, pad < kernel")
        out = pooled_size(size, k, p, s, param.round_mode == 0, bool(geo["pad"][0] or geo["pad"][1]))
        if (out - 1) * s - p >= size:
            raise _refuse(layer, f"its last window starts outside the image (size {size}, kernel {k}, stride {s}), "
                                 "where Caffe reads no data; use round_mode: FLOOR")
    try:
        onnx_pool_pads(param, bottom)
    except UnsupportedModelError as exc:
        raise _refuse(layer, str(exc).removeprefix("Pooling: ")) from None


def _check_blobs(layer, saved) -> None:
    needed = _BLOBS[layer.type]
    bias = {"Convolution": layer.convolution_param.bias_term, "Deconvolution": layer.convolution_param.bias_term,
            "InnerProduct": layer.inner_product_param.bias_term, "Scale": layer.scale_param.bias_term}.get(layer.type, False)
    needed += int(bool(bias))
    have = len(saved.blobs) if saved is not None else 0
    if have < needed:
        raise InputError(
            f"caffemodel holds {have} blob(s) for layer '{layer.name}' ({layer.type}), which needs {needed}; "
            "do the prototxt and caffemodel belong together?"
        )
    for blob in saved.blobs:
        blob_array(blob)  # declared shape matches the data


def check_supported(net, weights=None) -> None:
    """Refuse, with the layer's name and the reason, what qconsist cannot convert faithfully; reject
    weights that do not fit the network."""

    if len(net.layers) and not len(net.layer):
        raise UnsupportedModelError("V1 'layers' prototxt format is not supported; upgrade it with Caffe's upgrade_net_proto_text")
    for layer in layers_of(net):
        if layer.type not in SUPPORTED_LAYERS:
            raise UnsupportedModelError(
                f"layer '{layer.name}' has type '{layer.type}', which qconsist cannot convert faithfully "
                f"(supported: {', '.join(sorted(SUPPORTED_LAYERS))})"
            )
    if len(net.input) > 1:
        raise UnsupportedModelError(
            f"the network declares {len(net.input)} inputs in the legacy 'input:' form, which caffe2onnx reads as one; "
            "declare them as Input layers"
        )
    known = set(net.input)
    for layer in layers_of(net):
        missing = [b for b in layer.bottom if b not in known]
        if missing and layer.type != "Input":
            raise InputError(f"layer '{layer.name}' reads blob(s) {missing} that no earlier layer or input produces")
        if layer.type == "Crop" and len(layer.bottom) != 2:
            raise InputError(f"layer '{layer.name}' (Crop) has {len(layer.bottom)} bottom(s); Caffe's Crop takes two: "
                             "the blob to crop and the blob whose shape it takes")
        known.update(layer.top)
    if not known:
        raise InputError("the network has no layers")
    try:
        shapes = infer_shapes(net)
    except (ZeroDivisionError, IndexError, KeyError) as exc:
        raise InputError(f"cannot work out the network's blob shapes: {type(exc).__name__}: {exc}") from None
    saved = {layer.name: layer for layer in layers_of(weights)} if weights is not None else {}
    for layer in layers_of(net):
        if layer.type != "Input":
            _check_layer(layer, shapes, saved)


def convert_caffe(prototxt: Path, caffemodel: Path, output: Path, options: ConvertOptions = ConvertOptions()) -> ConvertResult:
    """Convert a Caffe model to ONNX at ``output`` (written atomically, only once every check passed)."""

    start = time.perf_counter()
    net = read_prototxt(prototxt)
    weights = read_caffemodel(caffemodel)
    check_supported(net, weights)
    net_for_tool, weights_for_tool, notes = prepare(net, weights)
    model = _run_caffe2onnx(net_for_tool, weights_for_tool, prototxt, output)
    del model.opset_import[:]
    model.opset_import.add(domain="", version=options.caffe_opset)
    model.ir_version = ir_version_for(options.caffe_opset)
    model.producer_name = "qconsist (caffe2onnx 2.0.1)"
    params = weights_by_layer(weights)  # float64 arrays, read once for the repairs and the check
    repairs = notes + repair_model(model, net, params, options)
    for line in repairs:
        log.info("convert repair: %s", line)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise UnsupportedModelError(f"converted model fails onnx.checker: {exc}") from None
    data = model.SerializeToString()
    convert_seconds = time.perf_counter() - start
    check = None
    if options.check:
        check = check_fidelity(data, net, params)
        log.info("convert check: max abs %.3g (tolerance %.3g) in %.2f s", check.max_abs, check.tolerance, check.seconds)
        if not check.passed:
            worst = max(check.outputs, key=lambda o: o.max_abs / o.tolerance if o.tolerance else float("inf"))
            raise FidelityError(f"converted model differs from the numpy Caffe reference: {worst.describe()}")
    write_bytes_atomic(Path(output), data)
    return ConvertResult(
        path=Path(output), opset=options.caffe_opset, ir_version=model.ir_version,
        seconds=time.perf_counter() - start, repairs=repairs, check=check, convert_seconds=convert_seconds,
    )


def convert_file(prototxt: Path, caffemodel: Path, output: Path, options: ConvertOptions = ConvertOptions()) -> ConvertResult:
    """What the pipeline's convert stage does to a Caffe model, as one call (``qconsist convert``): convert,
    repair, check (onnx.checker, the numpy reference unless ``options.check`` is off), then load the written
    model in onnxruntime."""
    for given in (prototxt, caffemodel):
        if Path(output).exists() and Path(output).resolve() == Path(given).resolve():
            raise ConfigError(f"`output` {output} is one of the inputs; choose another file")
    result = convert_caffe(prototxt, caffemodel, output, options)
    create_session(Path(output))
    return result


class _FastTensors:
    """Stands in for ``onnx.helper`` inside caffe2onnx while it runs: its ``make_tensor`` copies every weight
    value by value into ``float_data`` (about 1 s for open_nsfw's 6 M weights); this one stores the same
    values as ``raw_data`` (same tensor, same values). Everything else is onnx.helper's own."""

    def __getattr__(self, name: str):
        return getattr(onnx.helper, name)

    @staticmethod
    def make_tensor(name, data_type, dims, vals, raw=False):
        if raw or data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64):
            return onnx.helper.make_tensor(name, data_type, dims, vals, raw=raw)
        dtype = np.float32 if data_type == onnx.TensorProto.FLOAT else np.int64
        array = np.asarray(vals, dtype=dtype).reshape(-1)
        return onnx.helper.make_tensor(name, data_type, dims, array.tobytes(), raw=True)


@contextlib.contextmanager
def _fast_tensors(module):
    original = module.helper
    module.helper = _FastTensors()
    try:
        yield
    finally:
        module.helper = original


def _run_caffe2onnx(net, weights, prototxt: Path, output: Path) -> onnx.ModelProto:
    caffe_pb2()  # registers the message module caffe2onnx imports
    import caffe2onnx.src.caffe2onnx as tool

    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), warnings.catch_warnings(), _fast_tensors(tool):
            # -sys.float_info.max cast to float32 for its MaxPool Pad constant (that node is removed by repair)
            warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
            return tool.Caffe2Onnx(net, weights, net.name or "caffe").createOnnxModel()  # 3rd arg is the graph name
    except SystemExit:
        last = chatter.getvalue().strip().splitlines()[-1:] or ["no message"]
        raise UnsupportedModelError(f"caffe2onnx gave up on {prototxt}: {last[0]}") from None
    except (KeyError, IndexError, ValueError, AttributeError, TypeError, AssertionError, ZeroDivisionError) as exc:
        raise UnsupportedModelError(f"caffe2onnx cannot convert {prototxt}: {type(exc).__name__}: {exc}") from None


def refuse_external_data(path: Path, model: onnx.ModelProto) -> None:
    """qconsist hashes and copies one self-contained file per artifact: weights kept in external data files
    (``onnx.save(..., save_as_external_data=True)``, models over 2 GB) are refused in one line."""
    from onnx.external_data_helper import uses_external_data

    files = sorted({entry.value for tensor in model.graph.initializer if uses_external_data(tensor)
                    for entry in tensor.external_data if entry.key == "location"})
    if files:
        raise UnsupportedModelError(
            f"{path} keeps its weights in external data file(s) {', '.join(files)}; qconsist needs a self-contained "
            "model: save it with onnx.save(model, path, save_as_external_data=False)"
        )


def refuse_quantized(path: Path, model: onnx.ModelProto) -> None:
    """A model a pipeline quantizes must be a float model."""
    found = quantized_nodes(model)
    if found:
        kinds = ", ".join(sorted({n.op_type for n in found}))
        raise UnsupportedModelError(
            f"{path} is already quantized ({len(found)} {kinds} node(s)); give the float model it was made from"
        )


def check_onnx_entry(path: Path) -> onnx.ModelProto:
    """An ONNX model a pipeline starts from: readable, passes ``onnx.checker``, loads in onnxruntime."""
    import onnxruntime as ort


    model = read_onnx(path)
    refuse_external_data(path, model)
    refuse_quantized(path, model)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InputError(f"{path} fails the ONNX checker: {' '.join(str(exc).split())}") from None
    try:
        create_session(path)
    except UnsupportedModelError as exc:
        newest = re.search(r"till opset (\d+)", exc.message)
        if newest:
            opset = ai_onnx_opset(model)
            raise UnsupportedModelError(
                f"{path} uses ai.onnx opset {opset}; onnxruntime {ort.__version__} supports up to opset {newest.group(1)}"
            ) from None
        raise
    return model


def onnx_opset(model: onnx.ModelProto) -> int | None:
    """A model's ai.onnx opset (``None``: it imports none)."""
    return ai_onnx_opset(model)


# an upgraded ONNX entry against the original, as optimize is checked
UPGRADE_ATOL, UPGRADE_RTOL = 1e-5, 1e-4


def upgrade_opset(entry: Path, model: onnx.ModelProto, opset: int, output: Path, evaluation=None) -> tuple[dict, dict]:
    """Raise an ONNX entry's ai.onnx opset to ``opset`` with ``onnx.version_converter`` (written to ``output``
    atomically once checked: ``onnx.checker``, onnxruntime, and — with ``evaluation`` — its outputs against the
    original's within ``UPGRADE_ATOL + UPGRADE_RTOL·|x|``). Returns the stage's parameters and checks."""
    import onnxruntime as ort

    current = onnx_opset(model)
    if current is None:
        raise UnsupportedModelError(f"{entry} imports no ai.onnx opset; convert.opset cannot upgrade it")
    if opset < current:
        raise ConfigError(f"convert.opset {opset} is older than {entry}'s opset {current}: an ONNX entry's opset can "
                          "only be raised (remove the setting to keep the model's)")
    newest = onnxruntime_limits()[0]
    if newest is not None and opset > newest:
        raise ConfigError(f"convert.opset {opset}: onnxruntime {ort.__version__} loads up to opset {newest}")
    try:
        upgraded = version_converter.convert_version(model, opset)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError, ValueError, its own errors
        raise UnsupportedModelError(f"onnx.version_converter cannot raise {entry} from opset {current} to {opset}: "
                                    f"{' '.join(str(exc).split())[:200]}") from None
    upgraded.ir_version = max(model.ir_version, ir_version_for(opset))
    try:
        onnx.checker.check_model(upgraded, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise UnsupportedModelError(f"{entry} raised to opset {opset} fails onnx.checker: {' '.join(str(exc).split())[:200]}") from None
    data = upgraded.SerializeToString()
    create_session(data)
    checks: dict = {"onnx_checker": "passed", "onnxruntime_load": "passed", "outputs_vs_entry": None}
    if evaluation is not None:
        comparison = compare_outputs(outputs_of(entry, evaluation), outputs_of(data, evaluation),
                                     atol=UPGRADE_ATOL, rtol=UPGRADE_RTOL)
        if not comparison.passed:
            raise FidelityError(f"raising {entry} from opset {current} to {opset} changed its outputs beyond tolerance: "
                                f"{comparison.summary()}")
        checks["outputs_vs_entry"] = comparison.to_json()
    write_bytes_atomic(Path(output), data)
    params = {"entry": "onnx", "source": str(entry), "opset": opset, "opset_of_entry": current,
              "ir_version": upgraded.ir_version, "tool": f"onnx.version_converter (onnx {onnx.__version__})",
              "atol": UPGRADE_ATOL, "rtol": UPGRADE_RTOL}
    return params, checks


def make_batch_dynamic(entry: Path, target: Path, evaluation=None) -> tuple[dict, dict | None]:
    """Re-stamp the ONNX model at ``target`` (the entry, copied or raised) so that its inputs and outputs take
    any batch (``with_dynamic_batch``), written back once checked: ``onnx.checker``, onnxruntime, and — with
    ``evaluation`` — a step of the entry's fixed batch (the evaluation samples, repeated where there are fewer)
    through the entry against each of its samples alone through the re-stamped model, within
    ``UPGRADE_ATOL + UPGRADE_RTOL·|x|``: the graph must compute per sample. Returns what was re-stamped and the
    comparison (None without ``evaluation``)."""
    model = read_onnx(target)
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    fixed = {i.name: i.type.tensor_type.shape.dim[0].dim_value for i in inputs
             if i.type.HasField("tensor_type") and len(i.type.tensor_type.shape.dim)
             and i.type.tensor_type.shape.dim[0].HasField("dim_value")}
    if not fixed:
        raise ConfigError(f"convert.dynamic_batch: {entry} has no input with a fixed first dimension (its batch is "
                          "already dynamic): remove the setting")
    if len(set(fixed.values())) > 1 or len(fixed) < len(inputs):
        raise UnsupportedModelError(f"convert.dynamic_batch: {entry}'s inputs do not share one fixed batch "
                                    f"(first dimensions {fixed}); export it with a dynamic batch")
    batch = next(iter(fixed.values()))
    restamped = with_dynamic_batch(model)
    try:
        onnx.checker.check_model(restamped, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise UnsupportedModelError(f"{entry} with a dynamic batch fails onnx.checker: {' '.join(str(exc).split())[:200]}") from None
    data = restamped.SerializeToString()
    dynamic = create_session(data, MEASUREMENT)
    record = {"fixed_batch": batch, "inputs": sorted(fixed)}
    comparison = None
    if evaluation is not None:
        if len(evaluation) == 0:
            raise InputError(f"convert.dynamic_batch: the evaluation set {evaluation.source} is empty")
        original = create_session(target, MEASUREMENT)
        samples = [evaluation.sample(i % len(evaluation)) for i in range(batch)]
        names = [o.name for o in original.get_outputs()]
        step = {name: np.concatenate([s[name] for s in samples]) for name in samples[0]}
        try:
            whole = original.run(names, step)
            alone = [dynamic.run(names, sample) for sample in samples]
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors at run time
            raise UnsupportedModelError(f"convert.dynamic_batch: {entry} does not run on one sample once its batch of "
                                        f"{batch} is dynamic: {' '.join(str(exc).split())[:200]}") from None
        result = compare_outputs([{n: w[r:r + 1] for n, w in zip(names, whole)} for r in range(batch)],
                                 [dict(zip(names, a)) for a in alone], atol=UPGRADE_ATOL, rtol=UPGRADE_RTOL)
        if not result.passed:
            raise FidelityError(f"convert.dynamic_batch: {entry} does not compute per sample (a step of {batch} "
                                f"against each sample alone): {result.summary()}")
        comparison = result.to_json()
    write_bytes_atomic(Path(target), data)
    return record, comparison


class ConvertStage:
    """Caffe → ONNX (or, for an ONNX entry, the checked source model copied in)."""

    name = "convert"
    order = 10
    optional = False
    produces_float = True
    options_type = ConvertOptions

    def parse(self, table, base: Path) -> ConvertOptions:
        if table is None:
            return ConvertOptions()

        options = guard(table, lambda: ConvertOptions(
            opset=table.get("opset", int), dynamic_batch=table.get("dynamic_batch", bool, False),
            check=table.get("check", bool, True),
        ))
        table.finish()
        return options

    def run(self, source: Path | None, target: Path, options: ConvertOptions, context):  # -> StageRecord
        files = context.model_files
        start = time.perf_counter()
        result = None
        if "onnx" in files:  # an ONNX entry, given or bundled: nothing to convert, the opset raised if asked
            entry = Path(files["onnx"])
            model = check_onnx_entry(entry)
            opset = onnx_opset(model)
            if options.opset is not None and options.opset != opset:
                evaluation = context.evaluation(entry) if context.evaluation and options.check else None
                params, checks = upgrade_opset(entry, model, options.opset, target, evaluation)
            else:
                write_atomic(target, lambda tmp: shutil.copyfile(entry, tmp))
                params = {"entry": "onnx", "source": str(entry), "opset": opset, "ir_version": model.ir_version}
                checks = {"onnx_checker": "passed", "onnxruntime_load": "passed"}
            if options.dynamic_batch:
                evaluation = context.evaluation(entry) if context.evaluation and options.check else None
                params["dynamic_batch"], checks["dynamic_batch_vs_entry"] = make_batch_dynamic(entry, target, evaluation)
        else:
            result = convert_file(files["prototxt"], files["caffemodel"], target, options)
            params = {**options.to_json(), "opset": result.opset, "ir_version": result.ir_version, "repairs": result.repairs,
                      "tool": "caffe2onnx 2.0.1 + qconsist repairs"}
            checks = {"onnx_checker": "passed", "onnxruntime_load": "passed",
                      "caffe_reference": result.check.to_json() if result.check is not None else None}
        return StageRecord(self.name, target, params, hash_artifact(target, context.root), checks,
                           time.perf_counter() - start, result=result)


STAGE = ConvertStage()
