"""Artifacts and calibration tables of two runs: the first stage whose model differs, and how."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import numpy_helper

from qconsist.onnxfile import node_label
from qconsist.stages.calibration_table import quantization_parameters
from qconsist.store.hashing import initializer_digests
from qconsist.store.run import Run
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)


def _artifact(stage: dict[str, Any]) -> dict[str, Any] | None:
    artifact = stage.get("artifact")
    return artifact if isinstance(artifact, dict) else None


def _consumers(model: onnx.ModelProto) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for i, node in enumerate(model.graph.node):
        for inp in node.input:
            found.setdefault(inp, []).append(node_label(node, i))
    return found


@dataclass(frozen=True)
class AttributeChange:
    node: str
    attribute: str  # "(op, inputs or outputs)" when the node itself was rewired


@dataclass(frozen=True)
class InitializerChange:
    """An initializer whose value changed, with its consumers; for quantized models whether it is a scale
    or zero point."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    quantization_parameter: bool
    consumers: tuple[str, ...]
    elements_changed: int | None = None
    elements: int | None = None
    max_abs_diff: float | None = None


@serialized
@dataclass(frozen=True)
class ModelChanges:
    nodes_added: tuple[str, ...] = ()
    nodes_removed: tuple[str, ...] = ()
    attributes_changed: tuple[AttributeChange, ...] = ()
    initializers_added: tuple[str, ...] = ()
    initializers_removed: tuple[str, ...] = ()
    initializers_changed: tuple[InitializerChange, ...] = ()

    @property
    def quantization_parameters(self) -> tuple[InitializerChange, ...]:
        return tuple(c for c in self.initializers_changed if c.quantization_parameter)


@serialized
@dataclass
class StageComparison:
    """One stage's artifacts in the two runs."""

    name: str
    same_bytes: bool
    same_content: bool
    same_computation: bool
    md5_a: str | None
    md5_b: str | None
    metadata: tuple[str, ...] = ()  # what differs besides the computation (graph name, producer…)
    note: str = ""
    changes: ModelChanges | None = None  # for the first stage whose computation differs


@serialized
@dataclass
class ArtifactComparison:
    first_differing_stage: str | None = None
    stages: list[StageComparison] = field(default_factory=list)
    # how the two runs differ before any tensor: the stage and model each ran, stages only one holds, batch sizes,
    # a model re-stamped for another batch (``run_differences``); listed first by ``diff``
    differences: list[str] = field(default_factory=list)
    same_models: bool = True  # inference runs: both ran the same bytes; pipeline runs: both hold the same stages

    @property
    def identical(self) -> bool:
        """Every stage both runs hold computes the same, and the runs ran the same model (inference runs) or
        hold the same stages (pipeline runs)."""
        return self.first_differing_stage is None and self.same_models

    def stage(self, name: str) -> StageComparison | None:
        return next((s for s in self.stages if s.name == name), None)


@dataclass(frozen=True)
class CalibrationChange:
    tensor: str
    fields: tuple[str, ...]  # which of min, max, scale, zero_point changed
    a: dict[str, Any]
    b: dict[str, Any]


@serialized
@dataclass
class CalibrationComparison:
    compared: bool = False
    changed: list[CalibrationChange] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)


def model_changes(a: onnx.ModelProto, b: onnx.ModelProto) -> ModelChanges:
    """Nodes added and removed, attributes changed, initializers changed (with their consumers)."""
    nodes_a = {node_label(n, i): n for i, n in enumerate(a.graph.node)}
    nodes_b = {node_label(n, i): n for i, n in enumerate(b.graph.node)}
    attributes = []
    for name in sorted(set(nodes_a) & set(nodes_b)):
        na, nb = nodes_a[name], nodes_b[name]
        if na.op_type != nb.op_type or list(na.input) != list(nb.input) or list(na.output) != list(nb.output):
            attributes.append(AttributeChange(name, "(op, inputs or outputs)"))
            continue
        attrs_a = {x.name: x.SerializeToString(deterministic=True) for x in na.attribute}
        attrs_b = {x.name: x.SerializeToString(deterministic=True) for x in nb.attribute}
        for key in sorted(set(attrs_a) | set(attrs_b)):
            if attrs_a.get(key) != attrs_b.get(key):
                attributes.append(AttributeChange(name, key))
    inits_a = {i.name: i for i in a.graph.initializer}
    inits_b = {i.name: i for i in b.graph.initializer}
    consumers = _consumers(b)
    qparams = quantization_parameters(b)  # from the Q/DQ and QLinear nodes' schemas, never by name
    changed = []
    for name in sorted(set(inits_a) & set(inits_b)):
        ta, tb = numpy_helper.to_array(inits_a[name]), numpy_helper.to_array(inits_b[name])
        if ta.dtype == tb.dtype and ta.shape == tb.shape and ta.tobytes() == tb.tobytes():
            continue
        sizes: dict[str, Any] = {}
        if ta.shape == tb.shape and ta.size and ta.dtype.kind in "fiu" and tb.dtype.kind in "fiu":
            diff = abs(ta.astype("float64") - tb.astype("float64"))
            sizes = {"elements_changed": int((diff != 0).sum()), "elements": int(ta.size), "max_abs_diff": float(diff.max())}
        changed.append(InitializerChange(
            name=name, dtype=str(tb.dtype), shape=tuple(tb.shape), quantization_parameter=name in qparams,
            consumers=tuple(consumers.get(name, [])), **sizes,
        ))
    return ModelChanges(
        nodes_added=tuple(sorted(set(nodes_b) - set(nodes_a))),
        nodes_removed=tuple(sorted(set(nodes_a) - set(nodes_b))),
        attributes_changed=tuple(attributes),
        initializers_added=tuple(sorted(set(inits_b) - set(inits_a))),
        initializers_removed=tuple(sorted(set(inits_a) - set(inits_b))),
        initializers_changed=tuple(changed),
    )


_METADATA = ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string")


def semantic_hash(model: onnx.ModelProto, initializers: dict[str, Any] | None = None) -> str:
    """sha256 of what decides the computation: nodes, graph inputs, outputs and value types, opsets and
    initializer values. Not names of the model or graph (converters stamp file paths into them), doc
    strings, producers or metadata. ``initializers``: the artifact's recorded initializer digests
    (name -> digest JSON), which spare hashing the weights again."""
    h = hashlib.sha256()
    graph = model.graph
    for node in graph.node:
        bare = onnx.NodeProto()
        bare.CopyFrom(node)
        bare.doc_string = ""
        h.update(bare.SerializeToString(deterministic=True))
    for values in (graph.input, graph.output, graph.value_info):
        for value in values:
            h.update(value.name.encode() + value.type.SerializeToString(deterministic=True))
    h.update(repr(sorted((o.domain, o.version) for o in model.opset_import)).encode())
    if initializers is None:
        initializers = {name: digest.to_json() for name, digest in initializer_digests(model).items()}
    h.update(json.dumps(initializers, sort_keys=True).encode())
    return h.hexdigest()


def metadata_changes(a: onnx.ModelProto, b: onnx.ModelProto) -> list[str]:
    """Differences in what does not change the computation: names, producers, doc strings, metadata."""
    found = [f"{key}: {getattr(a, key)!r} -> {getattr(b, key)!r}" for key in _METADATA if getattr(a, key) != getattr(b, key)]
    for key in ("name", "doc_string"):
        if getattr(a.graph, key) != getattr(b.graph, key):
            found.append(f"graph.{key}: {getattr(a.graph, key)!r} -> {getattr(b.graph, key)!r}")
    props_a = {p.key: p.value for p in a.metadata_props}
    props_b = {p.key: p.value for p in b.metadata_props}
    if props_a != props_b:
        found.append(f"metadata_props: {props_a} -> {props_b}")
    return found


def _stage_models(a: Run, b: Run, stage: str) -> tuple[onnx.ModelProto, onnx.ModelProto] | None:
    """A stage's model in both runs, verified (``None`` when an external model is gone)."""
    model_a = a.model(stage)
    model_b = b.model(stage) if model_a is not None else None
    return (model_a, model_b) if model_a is not None and model_b is not None else None


def _md5(record: Any) -> str:
    return str(record.get("md5"))[:12] if isinstance(record, dict) and record.get("md5") else "unknown md5"


def external_data_changes(art_a: Any, art_b: Any) -> list[tuple[str, str]]:
    """The external data files (weights beside the ``.onnx``) of two recorded artifacts that differ, by name;
    nothing when either record predates ``external_data``."""
    files_a = art_a.get("external_data") if isinstance(art_a, dict) else None
    files_b = art_b.get("external_data") if isinstance(art_b, dict) else None
    if not isinstance(files_a, list) or not isinstance(files_b, list):
        return []
    by_a = {f.get("location"): f for f in files_a if isinstance(f, dict)}
    by_b = {f.get("location"): f for f in files_b if isinstance(f, dict)}
    changed = []
    for location in sorted(set(by_a) | set(by_b), key=str):
        fa, fb = by_a.get(location), by_b.get(location)
        if fa is None or fb is None:
            changed.append((str(location), f"{location} only in {'A' if fb is None else 'B'}'s model"))
        elif fa.get("sha256") != fb.get("sha256"):
            changed.append((str(location), f"{location} changed (sha256 {str(fa.get('sha256'))[:12]}… in A, "
                                           f"{str(fb.get('sha256'))[:12]}… in B)"))
    return changed


def run_differences(a: Run, b: Run) -> tuple[list[str], bool]:
    """Every difference between two runs that comes before any tensor, in words: the stage whose model each
    inference run ran, the model itself (its sha256), the stages only one run holds, the batch size, and a model
    re-stamped to take another batch size (``--dynamic-batch``: the bytes that ran are the re-stamped copy); and
    whether the runs' models are the same (inference runs: the bytes each ran; pipeline runs: their stages)."""
    lines: list[str] = []
    same = True
    model_a, model_b = a.manifest.model, b.manifest.model
    if a.kind == b.kind == "inference":
        stage_a, stage_b = model_a.get("stage"), model_b.get("stage")
        if stage_a != stage_b:
            lines.append(f"stage: A ran {'the ' + stage_a + ' stage' if stage_a else 'a model file'}'s model, "
                         f"B {'the ' + stage_b + ' stage' if stage_b else 'a model file'}'s")
        ran_a, ran_b = model_a.get("artifact"), model_b.get("artifact")
        sha_a = ran_a.get("sha256") if isinstance(ran_a, dict) else None
        sha_b = ran_b.get("sha256") if isinstance(ran_b, dict) else None
        if sha_a != sha_b:
            same = False
            lines.append(f"model: A ran {model_a.get('path', '?')} (md5 {_md5(ran_a)}), B ran {model_b.get('path', '?')} "
                         f"(md5 {_md5(ran_b)})")
        changed = external_data_changes(ran_a, ran_b)
        if changed:
            same = False
            lines.append("external data: " + "; ".join(text for _, text in changed))
    if a.kind == b.kind:
        stages_a, stages_b = a.model_stages(), b.model_stages()
        only_a = [s for s in stages_a if s not in stages_b]
        only_b = [s for s in stages_b if s not in stages_a]
        if only_a or only_b:
            same = same and a.kind == "inference"  # two inference runs: the model each ran decides
            lines.append("stages: " + "; ".join(
                f"only {side} holds {', '.join(names)}" for side, names in (("A", only_a), ("B", only_b)) if names))
    if a.has_inference and b.has_inference and a.inference.batch_size != b.inference.batch_size:
        lines.append(f"batch size: A {a.inference.batch_size}, B {b.inference.batch_size}")
    stamp_a, stamp_b = model_a.get("dynamic_batch"), model_b.get("dynamic_batch")
    if bool(stamp_a) != bool(stamp_b) or (stamp_a and stamp_b and stamp_a.get("sha256") != stamp_b.get("sha256")):
        def stamped(side: str, stamp: Any) -> str:
            if not stamp:
                return f"{side} ran its model as it is"
            return f"{side} ran it re-stamped to take any batch size ({stamp.get('path')}, md5 {_md5(stamp)})"
        lines.append(f"re-stamped: {stamped('A', stamp_a)}; {stamped('B', stamp_b)}")
    return lines, same


def compare_artifacts(a: Run, b: Run) -> ArtifactComparison:
    """Stage by stage (stages both runs have, in A's order): md5, content hash and, where the bytes
    differ, whether only metadata differs (a graph name, a producer) or the computation. For the first
    stage whose computation differs, what differs in it. Without the model files, the recorded content
    hashes decide. Every model a run holds is first verified against its recorded sha256: the recorded
    hashes are trusted only once the files are shown to be what was recorded."""
    a.verify_artifacts()
    b.verify_artifacts()
    result = ArtifactComparison()
    for stage_a in a.stages:
        stage_b = b.stage(stage_a["name"])
        art_a = _artifact(stage_a)
        art_b = _artifact(stage_b) if stage_b else None
        if art_a is None or art_b is None:
            continue
        # an artifact is its whole content: a model whose weights lie in external data files keeps the same .onnx
        # bytes when those change, and its recorded content hash (initializer values included) tells them apart
        same_bytes = art_a.get("sha256") == art_b.get("sha256") and (
            not art_a.get("content") or not art_b.get("content") or art_a.get("content") == art_b.get("content"))
        entry = StageComparison(
            name=stage_a["name"], same_bytes=same_bytes, same_content=art_a.get("content") == art_b.get("content"),
            same_computation=same_bytes, md5_a=art_a.get("md5"), md5_b=art_b.get("md5"),
        )
        result.stages.append(entry)
        if same_bytes:
            continue
        external = art_a.get("sha256") == art_b.get("sha256")  # same .onnx file, other content: its external data
        models = None if external else _stage_models(a, b, stage_a["name"])
        if external:
            entry.same_computation = False
            changed = external_data_changes(art_a, art_b)
            entry.note = ("the same .onnx bytes with another recorded content hash: the weights in its external data "
                          + (f"{', '.join(name for name, _ in changed)} changed between the runs" if changed else
                             "files changed between the runs (the files as they are now cannot show which)"))
        elif models is None:
            entry.same_computation = entry.same_content
            entry.note = "model files are gone; only their recorded hashes are compared"
        else:
            entry.same_computation = (
                semantic_hash(models[0], art_a.get("initializers")) == semantic_hash(models[1], art_b.get("initializers"))
            )
            entry.metadata = tuple(metadata_changes(*models))
        if result.first_differing_stage is None and not entry.same_computation:
            result.first_differing_stage = entry.name
            entry.changes = model_changes(*models) if models is not None else None
    result.differences, result.same_models = run_differences(a, b)
    return result


_CALIB_KEYS = ("min", "max", "scale", "zero_point")


def _close(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


def compare_calibration(a: Run, b: Run) -> CalibrationComparison:
    """Tensors of the calibration tables whose range, scale or zero point changed. Tables of equal digests (two
    inference runs of one pipeline run record their source's) are equal: nothing is opened to compare them."""
    (digest_a, tensors), (digest_b, _) = a.calibration_digest(), b.calibration_digest()
    if digest_a == digest_b:
        return CalibrationComparison(compared=bool(tensors), changed=[])
    table_a, table_b = a.calibration.table, b.calibration.table
    changed = []
    for tensor in sorted(set(table_a) & set(table_b)):
        ea, eb = table_a[tensor] or {}, table_b[tensor] or {}
        fields = [k for k in _CALIB_KEYS if k in ea or k in eb if not _close(ea.get(k), eb.get(k))]
        if fields:
            changed.append(CalibrationChange(tensor, tuple(fields), {k: ea.get(k) for k in _CALIB_KEYS},
                                             {k: eb.get(k) for k in _CALIB_KEYS}))
    return CalibrationComparison(
        compared=bool(table_a and table_b), changed=changed,
        only_a=sorted(set(table_a) - set(table_b)), only_b=sorted(set(table_b) - set(table_a)),
    )
