"""Whether repeated calibrations agreed by chance: the producers of the calibrated tensors, run again.

N calibrations that give one md5 show that the ranges came out the same N times, not that they must: on a GPU
execution provider a node whose kernel is not deterministic (an overlapping ConvTranspose under cuDNN's
EXHAUSTIVE or HEURISTIC search: ``qconsist.locate.nondeterminism``) gives other last bits on every run, and
whether those bits reach a range's extreme is chance (the FCN head calibrated 5 times on the CUDA EP gave one
md5 on an H200 and 2 in 5 on an H100, ../shared/gpu/README.md). So, when calibration runs on a GPU EP,
``check_producers`` applies the repeat rule of ``locate`` to the calibration itself: the float model, every node
output exposed, runs each of the first calibration samples ``runs`` times in one session made exactly as the
calibration's (its provider and options, graph optimizations off, as ONNX Runtime's calibrators run it); a
tensor whose bytes change between two runs of the same sample varies. For every calibrated activation that
varies it names the node that produces it and the origins upstream (nodes whose output varies while their
inputs did not, the rule ``locate`` uses), and ``RepeatResult`` says "N calibrations agree, but ...".

What was not compared is not called stable: the check records the samples and runs it compared.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qconsist.inference.dump import expose_all
from qconsist.inference.session import create_session
from qconsist.inputs.inputset import InputSet
from qconsist.onnxfile import read_onnx
from qconsist.stages.calibration_table import CalibrationTable
from qconsist.stages.quantize import CalibrationOptions
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

RUNS = 3  # runs of each sample in one session (locate's --session-runs default)
SAMPLES = 4  # calibration samples run again (the first ones)


@serialized
@dataclass(frozen=True)
class VaryingTensor:
    """A calibrated tensor whose values changed between runs of one sample in one session."""

    tensor: str
    producer: str  # the node that outputs it
    op_type: str
    origins: tuple[str, ...]  # upstream nodes (or the producer) whose output varies while their inputs do not
    samples: int  # steps in which it varied (of ``ProducerCheck.samples``)


@serialized
@dataclass
class ProducerCheck:
    """The repeat rule on the calibration's own inputs and session: which calibrated tensors vary."""

    provider: str
    samples: int  # calibration steps run again (of the calibration's batch size)
    runs: int  # runs of each, in one session
    checked: int  # calibrated activations compared
    varying: list[VaryingTensor] = field(default_factory=list)

    @property
    def stable(self) -> bool:
        return not self.varying

    def sentence(self) -> str:
        """What the finding means for an agreement of the md5s (``""``: nothing varied)."""
        if not self.varying:
            return ""
        parts = []
        for found in self.varying[:3]:
            origin = [o for o in found.origins if o != found.producer]
            parts.append(f"`{found.tensor}`'s range comes from `{found.producer}`, whose output varies between runs "
                         f"on this EP" + (f" (from `{'`, `'.join(origin)}`)" if origin else ""))
        more = f" (and {len(self.varying) - 3} more calibrated tensor(s))" if len(self.varying) > 3 else ""
        return "; ".join(parts) + more + ": the md5 can still change; pin or determinize"

    def evidence(self) -> str:
        return (f"{self.checked} calibrated tensor(s) compared over {self.runs} runs of {self.samples} calibration "
                f"step(s) in one {self.provider} session")


def calibrated_activations(table: CalibrationTable) -> list[str]:
    """The tensors whose ranges calibration measured (activations; weights and biases are constants)."""
    return sorted(e.tensor for e in table.entries.values() if e.kind == "activation")


def check_producers(model: Path, inputs: InputSet, calibration: CalibrationOptions, table: CalibrationTable,
                    runs: int = RUNS, samples: int = SAMPLES) -> ProducerCheck:
    """Run the float ``model`` as the calibration runs it, each of its first ``samples`` calibration steps (of the
    calibration's batch size) ``runs`` times in one session, and name the calibrated tensors that vary and where
    the variation starts."""
    original = read_onnx(model, external_data=True)
    exposed, names = expose_all(original)
    session: Any = create_session(exposed.SerializeToString(), calibration.session_options())
    producers = {out: node for node in original.graph.node for out in node.output if out}
    calibrated = [t for t in calibrated_activations(table) if t in producers]
    varied: dict[str, int] = {}
    wanted = [i.name for i in session.get_inputs()]
    count = 0
    for _, feed in inputs.batches(calibration.batch_size):  # the steps the calibration ran (cuDNN picks per shape)
        if count >= samples:
            break
        count += 1
        if len(feed) == 1 == len(wanted) and wanted[0] not in feed:  # one input, named by the set (as calibration feeds it)
            feed = {wanted[0]: next(iter(feed.values()))}
        first = session.run(names, feed)
        changed: set[str] = set()
        for _ in range(runs - 1):
            again = session.run(names, feed)
            changed |= {name for name, a, b in zip(names, first, again) if not _same(a, b)}
        for name in changed:
            varied[name] = varied.get(name, 0) + 1
    origins = _origins(original.graph, set(varied))
    varying = [
        VaryingTensor(tensor, _node_name(producers[tensor]), producers[tensor].op_type,
                      _upstream_origins(tensor, producers, origins, set(varied)), varied[tensor])
        for tensor in calibrated if tensor in varied
    ]
    check = ProducerCheck(calibration.provider, count, runs, len(calibrated), varying)
    log.info("calibration producers: %s; varying: %s", check.evidence(), ", ".join(v.tensor for v in varying) or "none")
    return check


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _node_name(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}({', '.join(o for o in node.output if o)})"


def _origins(graph: onnx.GraphProto, varied: set[str]) -> set[str]:
    """Tensors that vary while every input of their node was the same in every run: where variation starts."""
    found = set()
    for node in graph.node:
        outputs = [o for o in node.output if o in varied]
        if outputs and not any(i in varied for i in node.input if i):
            found.update(outputs)
    return found


def _upstream_origins(tensor: str, producers: dict[str, onnx.NodeProto], origins: set[str],
                      varied: set[str]) -> tuple[str, ...]:
    """The origin nodes at or above ``tensor``, walking up through tensors that varied (in the order met)."""
    seen, stack, named = set(), [tensor], []
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producers.get(name)
        if node is None:
            continue
        if name in origins:
            label = _node_name(node)
            if label not in named:
                named.append(label)
            continue
        stack.extend(i for i in node.input if i in varied)
    return tuple(named)
