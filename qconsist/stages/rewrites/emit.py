"""The nodes and initializers one rewrite adds, named after the node they replace; a node's attributes as values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

INT64_MAX = np.iinfo(np.int64).max


def attributes_of(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as plain values (strings decoded, repeated fields as lists)."""
    values: dict[str, Any] = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else list(value) if isinstance(value, (list, tuple)) else value
    return values


@dataclass
class Emitter:
    """Collects the replacement of node ``prefix``: nodes in order, initializers, one tensor name per step."""

    prefix: str
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)

    def constant(self, suffix: str, array: np.ndarray) -> str:
        name = f"{self.prefix}_{suffix}"
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op_type: str, inputs: list[str], suffix: str, output: str | None = None, **attributes) -> str:
        """Append a node named ``<prefix>_<suffix>``; its output is ``output`` or a tensor of the same name."""
        name = f"{self.prefix}_{suffix}"
        self.nodes.append(helper.make_node(op_type, inputs, [output or name], name=name, **attributes))
        return output or name

    def slice(self, source: str, axes: list[int], starts: list[int], ends: list[int], suffix: str,
              output: str | None = None) -> str:
        names = [self.constant(f"{suffix}_{what}", np.array(values, np.int64))
                 for what, values in (("starts", starts), ("ends", ends), ("axes", axes))]
        return self.node("Slice", [source, *names], suffix, output)

    def rename_last_output(self, output: str) -> None:
        """The last node writes ``output`` (the replaced node's output name)."""
        self.nodes[-1].output[0] = output
