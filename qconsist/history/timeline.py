"""A model's timeline: each night's hashes and verdict, and where a hash or the verdict first changed,
with what changed in the environment at the same time (``qconsist.environment.describe_changes``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qconsist.environment import describe_changes
from qconsist.errors import InputError
from qconsist.history.db import History
from qconsist.stages.base import stage_names
from qconsist.store.serde import serialized


@serialized
@dataclass(frozen=True)
class Change:
    """Something that differs from the previous night of the same model."""

    night_id: str
    previous_night: str
    what: str  # "hash" | "verdict"
    stage: str | None
    old: str | None
    new: str | None
    environment: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.what == "hash":
            text = f"{self.night_id}: stage '{self.stage}' md5 {str(self.old)[:12]} -> {str(self.new)[:12]} (was {self.previous_night})"
        else:
            text = f"{self.night_id}: verdict {self.old} -> {self.new} (was {self.previous_night})"
        env = "; ".join(self.environment) if self.environment else "environment unchanged"
        return f"{text}; {env}"


@dataclass
class Timeline:
    model: str
    nights: list[dict[str, Any]]
    changes: list[Change] = field(default_factory=list)

    def first_change(self, what: str, stage: str | None = None) -> Change | None:
        for change in self.changes:
            if change.what == what and (stage is None or change.stage == stage):
                return change
        return None

    def to_json(self) -> dict[str, Any]:
        nights = []
        for row in self.nights:
            nights.append({
                "night_id": row["night_id"], "started": row["started"], "finished": row["finished"],
                "seconds": row["seconds"], "handed_out": row["handed_out"], "status": row["status"],
                "night_status": row["night_status"], "error": row["error"], "entry_run": row["entry_run"],
                "hashes": row["hashes"], "verdict": row["verdict"], "figures": row["figures"],
                "gpu_type": row["gpu_type"], "gpus": row["gpus"],
            })
        return {"model": self.model, "nights": nights, "changes": [c.to_json() for c in self.changes]}


def _verdict_word(row: dict[str, Any]) -> str:
    if row["verdict"] is None:
        return "error" if row["status"] == "error" else "none"
    return "pass" if row["verdict"]["passed"] else "fail"


def model_timeline(history: History, model: str) -> Timeline:
    """Every night of ``model`` and each change against the night before it. A night whose process died
    reads as ``incomplete`` (the next nightly records it so; reading changes nothing)."""
    rows = history.model_rows(model)
    dead = set(history.abandoned())
    for row in rows:
        if row["night_id"] in dead:
            row["night_status"] = "incomplete"
            if row["status"] == "running":
                row["status"], row["error"] = "error", row["error"] or "night interrupted"
    if not rows:
        known = ", ".join(history.models()) or "none yet"
        raise InputError(f"no nightly history for model '{model}' in {history.path}; models: {known}")
    changes: list[Change] = []
    for previous, row in zip(rows, rows[1:]):
        env = tuple(describe_changes(previous["environment"], row["environment"]))
        for stage in sorted(set(previous["hashes"]) | set(row["hashes"]), key=_stage_order):
            old = (previous["hashes"].get(stage) or {}).get("md5")
            new = (row["hashes"].get(stage) or {}).get("md5")
            if old != new and old is not None and new is not None:
                changes.append(Change(row["night_id"], previous["night_id"], "hash", stage, old, new, env))
        old_word, new_word = _verdict_word(previous), _verdict_word(row)
        if old_word != new_word:
            changes.append(Change(row["night_id"], previous["night_id"], "verdict", None, old_word, new_word, env))
    return Timeline(model=model, nights=rows, changes=changes)


def _stage_order(stage: str) -> tuple[int, str]:

    order = {"source": 0, **{name: i + 1 for i, name in enumerate(stage_names())}}
    return order.get(stage, len(order) + 1), stage
