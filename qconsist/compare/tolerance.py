"""Tolerances for comparing two runs: one ``atol``/``rtol`` for every tensor, and per-node overrides.

``Tolerance()`` (the default) is the exact mode: an element differs when its bytes differ. With a
tolerance, an element is beyond it when ``|b − a| > atol + rtol·|a|`` (``TensorStats``' rule, as
``numpy.isclose``), in the tensor's own units: ``atol = 1`` on an int8 tensor is one quantum.

Per-node tolerances come from a policy's ``[diff]`` section::

    [diff]
    atol = 0.0
    rtol = 0.0
    [diff.nodes]                 # node label or tensor name, shell patterns, first match wins
    "conv_*" = { atol = 1.0 }    # a missing key keeps the section's value
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any

from qconsist.errors import ConfigError


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class NodeTolerance:
    pattern: str
    atol: float
    rtol: float

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ConfigError(f"a per-node tolerance needs a node name or pattern, got {self.pattern!r}")
        _number(self.atol, f"`atol` of {self.pattern!r}")
        _number(self.rtol, f"`rtol` of {self.pattern!r}")


@dataclass(frozen=True)
class Tolerance:
    """``exact`` (no tolerance) unless ``atol``, ``rtol`` or a per-node entry is set."""

    atol: float = 0.0
    rtol: float = 0.0
    nodes: tuple[NodeTolerance, ...] = ()

    def __post_init__(self) -> None:
        _number(self.atol, "`atol`")
        _number(self.rtol, "`rtol`")

    @property
    def exact(self) -> bool:
        return self.atol == 0.0 and self.rtol == 0.0 and not self.nodes

    def for_node(self, *names: str) -> tuple[float, float]:
        """(atol, rtol) for a node known by any of ``names`` (its label, its tensor)."""
        for entry in self.nodes:
            if any(fnmatch.fnmatchcase(name, entry.pattern) for name in names if name):
                return entry.atol, entry.rtol
        return self.atol, self.rtol

    def to_json(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol,
                "nodes": {n.pattern: {"atol": n.atol, "rtol": n.rtol} for n in self.nodes}}

    @classmethod
    def from_json(cls, data: Any, where: str = "[diff]") -> "Tolerance":
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a table")
        unknown = sorted(set(data) - {"atol", "rtol", "nodes"})
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: atol, nodes, rtol")
        atol = _number(data.get("atol", 0.0), f"{where} atol")
        rtol = _number(data.get("rtol", 0.0), f"{where} rtol")
        nodes = data.get("nodes", {})
        if not isinstance(nodes, dict):
            raise ConfigError(f"{where}: 'nodes' must be a table of node -> {{atol, rtol}}")
        entries = []
        for pattern, value in nodes.items():
            if not isinstance(value, dict) or set(value) - {"atol", "rtol"}:
                raise ConfigError(f"{where}.nodes: {pattern!r} must be a table with atol and/or rtol")
            entries.append(NodeTolerance(pattern, _number(value.get("atol", atol), f"{where}.nodes {pattern!r} atol"),
                                         _number(value.get("rtol", rtol), f"{where}.nodes {pattern!r} rtol")))
        return cls(atol, rtol, tuple(entries))

    def with_overrides(self, atol: float | None, rtol: float | None) -> "Tolerance":
        """This tolerance with the command line's ``atol``/``rtol`` in place of the policy's defaults."""
        return Tolerance(self.atol if atol is None else atol, self.rtol if rtol is None else rtol, self.nodes)
