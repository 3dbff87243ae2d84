"""Which graph transformers onnxruntime applies to a model, asked of the installed onnxruntime itself.

The names are not taken from a list: ``transformer_activity`` opens a session with onnxruntime's verbose log
(``qconsist.inference.session.optimizer_log``) and reads, level by level, every transformer it applied and
whether that transformer changed the graph (``GraphTransformer <name> modified: 1``). Those names are the
ones ``disabled_optimizers`` accepts on this version (onnxruntime ignores a name it does not have, so a name
guessed from another version would silently do nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from qconsist.inference.session import ExecutionOptions, optimizer_log
from qconsist.store.serde import serialized

_LEVEL = re.compile(r"Graph transformer step \d+ of \d+ for level (\d+) started")
_APPLYING = re.compile(r"Applying graph transformer (\S+) on step \d+")
_MODIFIED = re.compile(r"GraphTransformer (\S+) modified: (\d+)")


@serialized
@dataclass(frozen=True)
class TransformerActivity:
    """One graph transformer as onnxruntime's log shows it: its name, the transformer level it runs at
    (onnxruntime's own numbering: 1 basic, 2 extended, 3 and up layout and the rest), whether it changed the
    graph in any step."""

    name: str
    level: int
    modified: bool


@serialized
@dataclass(frozen=True)
class TransformerLog:
    """The transformers one session applied, in the order onnxruntime first applied them."""

    transformers: tuple[TransformerActivity, ...] = field(default_factory=tuple)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.transformers]

    @property
    def modifying(self) -> list[str]:
        """The transformers that changed the graph: the only ones that can change results."""
        return [t.name for t in self.transformers if t.modified]


def parse_transformer_log(text: str) -> TransformerLog:
    """The transformers an onnxruntime verbose session log names, with their level and whether they modified
    the graph."""
    level = 0
    levels: dict[str, int] = {}
    modified: dict[str, bool] = {}
    order: list[str] = []
    for line in text.splitlines():
        found = _LEVEL.search(line)
        if found:
            level = int(found.group(1))
            continue
        found = _APPLYING.search(line) or _MODIFIED.search(line)
        if found:
            name = found.group(1)
            if name not in levels:
                levels[name] = level
                order.append(name)
            if found.re is _MODIFIED:
                modified[name] = modified.get(name, False) or found.group(2) != "0"
    return TransformerLog(tuple(TransformerActivity(n, levels[n], modified.get(n, False)) for n in order))


def transformer_activity(
    model: str | Path | bytes, options: ExecutionOptions, disabled_optimizers: Sequence[str] = (),
) -> TransformerLog:
    """The transformers onnxruntime applies to ``model`` under ``options`` (one session, log read)."""
    return parse_transformer_log(optimizer_log(model, options, disabled_optimizers=disabled_optimizers))
