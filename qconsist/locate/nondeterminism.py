"""Operators known to give different outputs from run to run (or session to session) on ONNX Runtime's
CUDA execution provider: the condition, the mechanism, the fix and where it is documented; and
``find_nondeterministic_nodes``, which lists a model's nodes that match, with the reason.

Kinds: ``run-to-run`` (the same session gives another output on the next run), ``session-to-session``
(each session is stable, a new one may not be), ``data-dependent`` (only for some input values) and
``by design`` (random operators). Rows depend on the CUDA EP settings where the settings change the kernel:
the cuDNN algorithm search and the session option ``use_deterministic_compute``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.errors import InputError
from qconsist.inference.session import ConvAlgoSearch
from qconsist.onnxfile import node_label, read_onnx
from qconsist.stages.rewrites.emit import attributes_of
from qconsist.stages.rewrites.subpixel import overlaps
from qconsist.store.serde import serialized

SCHEMA = "qconsist.nondeterminism/1"
ORT = "https://github.com/microsoft/onnxruntime/blob/main/onnxruntime"
MEASURED = ("measured by qconsist on an H100 (onnxruntime-gpu 1.31.1, cuDNN 9.14, driver 580.159.04), 3 fresh sessions "
            "x 20 runs: ConvTranspose kernel 4 stride 2 pad 1 (64 -> 32 channels, 56x56) gave 60 distinct outputs under "
            "EXHAUSTIVE and HEURISTIC with use_tf32=0, with or without use_deterministic_compute (cuDNN engine 25, which "
            "cuDNN marks CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC); 1 under DEFAULT (engine 1) and 1 with use_tf32=1 "
            "(engines 65 and 76, TF32 tensor-core kernels, not marked); kernel == stride was stable; "
            "ScatterElements(reduction=add) varied on every run in every setting")


@dataclass(frozen=True)
class CudaSettings:
    """The CUDA EP settings that change which kernel runs (ONNX Runtime's defaults)."""

    conv_algo_search: ConvAlgoSearch = ConvAlgoSearch.EXHAUSTIVE
    use_deterministic_compute: bool = False
    use_tf32: bool = True  # ONNX Runtime's default


@dataclass(frozen=True)
class Node:
    """What a row's test sees of one node."""

    node: onnx.NodeProto
    attributes: dict
    constants: dict[str, np.ndarray]
    shapes: dict[str, tuple]


Match = Callable[[Node, CudaSettings], "str | None"]


@dataclass(frozen=True)
class KnownNondeterminism:
    id: str
    op_types: tuple[str, ...]
    condition: str
    kind: str
    mechanism: str
    fix: str
    sources: tuple[str, ...]
    match: Match = field(repr=False, compare=False)
    domain: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "op_types": list(self.op_types), "domain": self.domain, "condition": self.condition,
                "kind": self.kind, "mechanism": self.mechanism, "fix": self.fix, "sources": list(self.sources)}


# --- the tests of the rows --------------------------------------------------------------------------------


def _conv_transpose_overlap(n: Node, settings: CudaSettings) -> str | None:
    if settings.conv_algo_search is ConvAlgoSearch.DEFAULT:
        return None
    weight = n.constants.get(n.node.input[1]) if len(n.node.input) > 1 else None
    kernel = list(n.attributes.get("kernel_shape", weight.shape[2:] if weight is not None else []))
    if not kernel:
        return "kernel unknown (weight computed at run time): its windows may overlap"
    strides = list(n.attributes.get("strides", [1] * len(kernel)))
    dilations = list(n.attributes.get("dilations", [1] * len(kernel)))
    axes = [a for a in range(len(kernel)) if overlaps(kernel[a], strides[a], dilations[a])]
    if not axes:
        return None
    reason = (f"kernel {kernel}, stride {strides}, dilation {dilations}: windows overlap on axis "
              f"{', '.join(str(a + 2) for a in axes)} ({settings.conv_algo_search.value} search")
    if settings.use_tf32:
        return reason + ", use_tf32 on: cuDNN may pick a TF32 engine that is deterministic, as it did on an H100 — the engine record of locate says which ran)"
    return reason + ", use_tf32 off)"


def _scatter_reduction(reductions: tuple[str, ...]) -> Match:
    def match(n: Node, settings: CudaSettings) -> str | None:
        reduction = n.attributes.get("reduction", "none")
        return f"reduction '{reduction}' (float additions / products in the order the atomics land)" if reduction in reductions else None
    return match


def _scatter_duplicates(n: Node, settings: CudaSettings) -> str | None:
    if n.attributes.get("reduction", "none") != "none":
        return None
    indices = n.constants.get(n.node.input[1])
    if indices is None:
        return "reduction 'none' with indices computed at run time: the last write wins in any order if two indices repeat"
    if n.node.op_type == "ScatterND":
        targets = indices.reshape(-1, indices.shape[-1])
    else:
        axis = int(n.attributes.get("axis", 0)) % indices.ndim
        grid = np.indices(indices.shape)
        grid[axis] = indices
        targets = grid.reshape(indices.ndim, -1).T
    if len(np.unique(targets, axis=0)) < len(targets):
        return "reduction 'none' with repeated constant indices: the last write wins in any order"
    return None


def _reduce_sum_rows(n: Node, settings: CudaSettings) -> str | None:
    if settings.use_deterministic_compute:
        return None
    shape = n.shapes.get(n.node.input[0])
    axes = n.attributes.get("axes")
    if axes is None and len(n.node.input) > 1 and n.node.input[1]:
        value = n.constants.get(n.node.input[1])
        axes = None if value is None else value.reshape(-1).tolist()
    if shape is None or axes is None:
        return None
    rank = len(shape)
    axes = sorted({a % rank for a in axes}) if rank else []
    if axes and axes[0] == 0 and axes == list(range(axes[-1] + 1)) and axes[-1] != rank - 1:
        return (f"sums leading axes {axes} of a {rank}-D tensor: ONNX Runtime's fast row reduction adds partial sums "
                "with atomics (use_deterministic_compute is off)")
    return None


def _topk_radix(n: Node, settings: CudaSettings) -> str | None:
    shape = n.shapes.get(n.node.input[0])
    if not shape:
        return None
    size = shape[int(n.attributes.get("axis", -1)) % len(shape)]
    if isinstance(size, int) and size <= 1024:
        return None
    k = n.constants.get(n.node.input[1]) if len(n.node.input) > 1 else None
    k_value = int(k.reshape(-1)[0]) if k is not None else None
    if n.attributes.get("sorted", 1) == 1 and k_value is not None and k_value > 256 * 16:
        return None
    return f"axis of {size if isinstance(size, int) else 'unknown'} elements (> 1024): the RadixTopK kernel"


def _group_norm(n: Node, settings: CudaSettings) -> str | None:
    return "no deterministic CUDA kernel (ONNX Runtime warns so under use_deterministic_compute)"


def _conv_autotune(n: Node, settings: CudaSettings) -> str | None:
    if settings.conv_algo_search is not ConvAlgoSearch.EXHAUSTIVE:
        return None
    return "EXHAUSTIVE search times the cuDNN algorithms when a session starts and keeps the fastest"


def _random(n: Node, settings: CudaSettings) -> str | None:
    if n.node.op_type == "Dropout":
        mode = n.node.input[2] if len(n.node.input) > 2 else ""
        value = n.constants.get(mode) if mode else None
        if not mode or value is not None and not bool(value.reshape(-1)[0]):
            return None
        return "training_mode is set or computed: random masks"
    return None if "seed" in n.attributes else "no seed attribute: a new random draw on every run"


KNOWN: tuple[KnownNondeterminism, ...] = (
    KnownNondeterminism(
        id="conv_transpose_overlapping_windows", op_types=("ConvTranspose",),
        condition="windows overlap (two kernel taps reach one output: kernel > stride at dilation 1), "
                  "cudnn_conv_algo_search EXHAUSTIVE or HEURISTIC; measured with use_tf32=0 (with use_tf32=1 the H100's "
                  "heuristics picked deterministic TF32 engines: a choice per shape and GPU, not a guarantee)",
        kind="run-to-run",
        mechanism="ONNX Runtime built with cuDNN 9 runs ConvTranspose as a cuDNN frontend backward-data (dgrad) graph whose "
                  "engine comes from heuristics mode B (EXHAUSTIVE) or A (HEURISTIC), FALLBACK for DEFAULT; it neither "
                  "deselects engines carrying the NONDETERMINISTIC numerical note nor reads use_deterministic_compute. "
                  "Backward-data engines that accumulate the overlapping contributions with atomic adds are "
                  "non-deterministic (cuDNN documents CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 so); " + MEASURED,
        fix="qconsist.stages.determinize: sub-pixel Conv + DepthToSpace (bit-stable in all three search modes at the "
            "original's speed); or cudnn_conv_algo_search=DEFAULT (1.5-30x slower); or use_tf32=1 where locate's engine "
            "record shows a deterministic engine (TF32 rounding: on fcn_head's QDQ model 58,000 int8 values differ "
            "from use_tf32=0)",
        sources=(f"{ORT}/core/providers/cuda/nn/conv_transpose.cc",
                 "https://docs.nvidia.com/deeplearning/cudnn/latest/api/cudnn-cnn-library.html",
                 "https://github.com/NVIDIA/cudnn-frontend",
                 "https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html"),
        match=_conv_transpose_overlap,
    ),
    KnownNondeterminism(
        id="scatter_elements_atomic_reduction", op_types=("ScatterElements",), condition="reduction 'add' or 'mul'",
        kind="run-to-run",
        mechanism="the CUDA kernel applies every update with an atomic add / multiply, in whatever order the threads "
                  "run (min and max give the same result in any order); " + MEASURED.split("; ")[-1],
        fix="add: qconsist.stages.determinize (one-hot MatMul, small index ranges); mul: none",
        sources=("https://github.com/microsoft/onnxruntime/pull/19198",
                 f"{ORT}/core/providers/cuda/tensor/gather_elements_impl.cu"),
        match=_scatter_reduction(("add", "mul")),
    ),
    KnownNondeterminism(
        id="scatter_nd_atomic_reduction", op_types=("ScatterND",), condition="reduction 'add' or 'mul'",
        kind="run-to-run",
        mechanism="ScatterNDWithAtomicReduction applies every update with an atomic operation, in any order",
        fix="none in qconsist (no deterministic ONNX form implemented); run that node on the CPU",
        sources=(f"{ORT}/core/providers/cuda/tensor/scatter_nd.h", f"{ORT}/core/providers/cuda/tensor/scatter_nd_impl.cu"),
        match=_scatter_reduction(("add", "mul")),
    ),
    KnownNondeterminism(
        id="scatter_repeated_indices", op_types=("ScatterElements", "ScatterND"),
        condition="reduction 'none' and two indices name one element (constant indices are checked; others may)",
        kind="data-dependent",
        mechanism="each update is written by its own thread: with repeated indices the last write wins in any order "
                  "(ONNX leaves the result undefined)",
        fix="give unique indices, or use a reduction",
        sources=("https://onnx.ai/onnx/operators/onnx__ScatterElements.html", "https://onnx.ai/onnx/operators/onnx__ScatterND.html"),
        match=_scatter_duplicates,
    ),
    KnownNondeterminism(
        id="reduce_sum_leading_axes", op_types=("ReduceSum",),
        condition="reduces contiguous leading axes (not the last), use_deterministic_compute off",
        kind="run-to-run",
        mechanism="ReduceSum's fast matrix-row reduction (reduce_matrix_rows) adds each block's partial column sums "
                  "into the output with atomic_add when more than one block covers the rows; ONNX Runtime skips it "
                  "under use_deterministic_compute",
        fix="SessionOptions.use_deterministic_compute = True (cuDNN's reduction instead)",
        sources=(f"{ORT}/core/providers/cuda/reduction/reduction_ops.cc",
                 f"{ORT}/core/providers/cuda/reduction/reduction_functions.cu",
                 f"{ORT}/core/providers/cuda/reduction/reduction_functions.cc"),
        match=_reduce_sum_rows,
    ),
    KnownNondeterminism(
        id="topk_radix", op_types=("TopK",), condition="the axis is longer than 1024 and K <= 4096 (or sorted = 0)",
        kind="run-to-run",
        mechanism="RadixTopK, which ONNX Runtime itself warns may be non-deterministic even under use_deterministic_compute "
                  "(order of equal values)",
        fix="none (the values are stable where no two are equal)",
        sources=(f"{ORT}/core/providers/cuda/math/topk_impl.cuh",),
        match=_topk_radix,
    ),
    KnownNondeterminism(
        id="group_norm", op_types=("GroupNorm", "SkipGroupNorm"), domain="com.microsoft", condition="always",
        kind="run-to-run", mechanism="ONNX Runtime: 'GroupNorm has no deterministic CUDA kernel'",
        fix="none; decompose into InstanceNormalization-style ONNX operators before export",
        sources=(f"{ORT}/contrib_ops/cuda/diffusion/group_norm.cc",),
        match=_group_norm,
    ),
    KnownNondeterminism(
        id="conv_algorithm_autotune", op_types=("Conv",), condition="cudnn_conv_algo_search EXHAUSTIVE",
        kind="session-to-session",
        mechanism="EXHAUSTIVE times the cuDNN forward algorithms when a session first sees an input shape "
                  "(cudnnFindConvolutionForwardAlgorithmEx) and keeps the fastest; another session can pick another "
                  "(each deterministic) algorithm, whose sums round differently in the last bits, and int8 calibration "
                  "turns that into other scales (qconsist's open_nsfw finding, README). HEURISTIC asks cuDNN's "
                  "heuristics (cudnnGetConvolutionForwardAlgorithm_v7), DEFAULT fixes IMPLICIT_PRECOMP_GEMM",
        fix="cudnn_conv_algo_search HEURISTIC or DEFAULT (qconsist locate measures which one is stable and fastest)",
        sources=(f"{ORT}/core/providers/cuda/nn/conv.cc",
                 "https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html"),
        match=_conv_autotune,
    ),
    KnownNondeterminism(
        id="random_operators", op_types=("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                                         "Multinomial", "Bernoulli", "Dropout"),
        condition="no seed attribute (Dropout: training_mode set)", kind="by design",
        mechanism="a new random draw on every run", fix="set the seed attribute; export Dropout in inference mode",
        sources=("https://onnx.ai/onnx/operators/onnx__RandomNormal.html", "https://onnx.ai/onnx/operators/onnx__Dropout.html"),
        match=_random,
    ),
)


@dataclass
class Finding:
    node: str
    op_type: str
    row: str
    kind: str
    reason: str
    fix: str


@serialized(
    schema=SCHEMA, derived=("passed",), error=InputError,
    refused="not a non-determinism report of schema {schema}: {found!r}",
    malformed="non-determinism report is malformed: {exc}",
)
@dataclass
class NondeterminismReport:
    findings: list[Finding]
    settings: CudaSettings

    @property
    def passed(self) -> bool:
        """No node that varies from run to run under these settings."""
        return not any(f.kind == "run-to-run" for f in self.findings)

    def __bool__(self) -> bool:
        return self.passed

    def nodes(self, kind: str | None = None) -> list[str]:
        return [f.node for f in self.findings if kind is None or f.kind == kind]


def _views(model: onnx.ModelProto):
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = model
    shapes = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape"):
            shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    shapes.update({name: tuple(array.shape) for name, array in constants.items()})
    return constants, shapes


def find_nondeterministic_nodes(model: onnx.ModelProto | Path, settings: CudaSettings = CudaSettings()) -> NondeterminismReport:
    """Every node of ``model`` that matches a row of ``KNOWN`` under ``settings``, in graph order."""
    if not isinstance(model, onnx.ModelProto):
        model = read_onnx(model, external_data=True)
    constants, shapes = _views(model)
    findings = []
    for index, node in enumerate(model.graph.node):
        view = None
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        for row in KNOWN:
            if node.op_type not in row.op_types or domain != row.domain:
                continue
            view = view or Node(node, attributes_of(node), constants, shapes)
            reason = row.match(view, settings)
            if reason:
                findings.append(Finding(node_label(node, index), node.op_type, row.id, row.kind, reason, row.fix))
    return NondeterminismReport(findings, settings)
