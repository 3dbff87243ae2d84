"""The figures the history keeps per model and night, and where each comes from.

A figure is one number per entry (a model, or a model on one GPU type, on one night), named like a gate check's
figure: ``drift.baseline.max_abs_diff``. The gate's verdict gives most of them (``verdict_figures``); other parts
of qconsist record their own through ``History.record_figures`` (the run accuracy, say, as ``accuracy.top1`` and
``accuracy.top5``). A name this module does not list is kept and shown under its own name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from qconsist.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")


class Scale(str, Enum):
    """How a figure is read: a magnitude spanning decades (``log``), a share between 0 and 1 (``share``), or a count."""

    LOG = "log"
    SHARE = "share"
    COUNT = "count"


@dataclass(frozen=True)
class Figure:
    name: str
    label: str  # what a reader calls it (plot titles)
    short: str  # a table column's heading
    scale: Scale
    better: str  # "lower" or "higher": which way a change is good news


FIGURES = (
    Figure("accuracy.top1", "Run accuracy: top-1", "top-1 acc.", Scale.SHARE, "higher"),
    Figure("accuracy.top5", "Run accuracy: top-5", "top-5 acc.", Scale.SHARE, "higher"),
    Figure("labels.accuracy", "Top-1 accuracy against the labels (gate check labels.accuracy)", "labels acc.", Scale.SHARE, "higher"),
    Figure("drift.float.max_abs_diff", "Drift against the float model: greatest |difference| of the final outputs",
           "drift float |Δ|", Scale.LOG, "lower"),
    Figure("drift.float.top1_agreement", "Drift against the float model: top-1 agreement", "float top-1 agr.", Scale.SHARE, "higher"),
    Figure("drift.baseline.max_abs_diff", "Drift against the baseline night: greatest |difference| of the final outputs",
           "drift baseline |Δ|", Scale.LOG, "lower"),
    Figure("drift.baseline.top1_agreement", "Drift against the baseline night: top-1 agreement", "baseline top-1 agr.",
           Scale.SHARE, "higher"),
    Figure("divergence.nodes", "Nodes whose dumps differ from the baseline night's", "diverging nodes", Scale.COUNT, "lower"),
    Figure("calibration.distinct_md5", "Repeated calibration: distinct quantized md5 (1 = the repeats agree)",
           "calib. md5s", Scale.COUNT, "lower"),
)
KNOWN = {figure.name: figure for figure in FIGURES}


def describe(name: str) -> Figure:
    """The figure ``name`` (one this module does not list: shown under its own name, on a linear scale)."""
    return KNOWN.get(name) or Figure(name, name, name, Scale.COUNT, "higher")


def order(names: Any) -> list[str]:
    """Figure names in the order a reader meets them: the listed ones first, then the others by name."""
    rank = {figure.name: index for index, figure in enumerate(FIGURES)}
    return sorted(set(names), key=lambda name: (rank.get(name, len(rank)), name))


def check_figures(figures: Mapping[str, Any]) -> dict[str, float]:
    """``figures`` as ``{name: float}``, or a ``ConfigError`` naming the bad name or value. NaN is refused (it
    is no measurement); an infinite value is kept (a difference that overflowed is one)."""
    if not isinstance(figures, Mapping):
        raise ConfigError(f"figures must be a mapping of name to number, got {type(figures).__name__}")
    checked = {}
    for name, value in figures.items():
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigError(f"figure name {name!r} must be dotted lower-case words such as 'accuracy.top1'")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"figure {name} must be a number, got {value!r}")
        checked[name] = float(value)
    return checked


def _number(value: Any) -> float | None:
    """A measured figure from a verdict's JSON (non-finite ones are written there as strings)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def verdict_figures(verdict: Mapping[str, Any] | None) -> dict[str, float]:
    """The figures a gate verdict (its JSON, schema ``qconsist.gate/1``) measured: the drift of the final outputs
    against the float model and the baseline night, the accuracy against labels, how many repeated calibrations
    disagreed and how many nodes' dumps differ from the baseline's. A check that did not apply gives none."""
    if not isinstance(verdict, Mapping):
        return {}
    found: dict[str, float] = {}
    for check in verdict.get("checks") or []:
        if not isinstance(check, Mapping) or check.get("status") == "not_applicable":
            continue
        measured = check.get("measured") or {}
        if not isinstance(measured, Mapping):
            continue
        name = check.get("name")
        wanted: dict[str, str] = {}
        if name in ("drift.float", "drift.baseline"):
            wanted = {"max_abs_diff": f"{name}.max_abs_diff", "top1_agreement": f"{name}.top1_agreement"}
        elif name == "labels.accuracy":
            wanted = {"accuracy": "labels.accuracy"}
        elif name == "calibration.repeat":
            wanted = {"distinct_md5": "calibration.distinct_md5"}
        for key, figure in wanted.items():
            value = _number(measured.get(key))
            if value is not None:
                found[figure] = value
    diff = verdict.get("diff")
    tensors = diff.get("tensors") if isinstance(diff, Mapping) else None
    if isinstance(tensors, Mapping) and isinstance(tensors.get("nodes"), list):
        found["divergence.nodes"] = float(len(tensors["nodes"]))
    return found
