"""The history at a glance: for every model (and GPU type) every night's status, artifact hashes, figures, the
entry's own seconds, the gate's first diverging node and origin nodes, and what changed against the night before —
the data of the history page (``qconsist.report.history``).

``summarize_history`` reads the database (read-only is enough) through ``History.model_rows`` and
``model_timeline`` (the one definition of a change), keeps the models, GPU types and last nights asked for, and
returns a ``HistorySummary`` (schema ``qconsist.history-summary/1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from qconsist.environment import describe_changes
from qconsist.errors import ConfigError, InputError, RunStoreError
from qconsist.history.db import History
from qconsist.history.figures import order
from qconsist.history.timeline import model_timeline
from qconsist.store.serde import serialized

SUMMARY_SCHEMA = "qconsist.history-summary/1"
NO_GPU = "none (CPU)"
QUANTIZED = "quantize"  # the stage whose artifact a team ships


def gpu_label(gpu_type: str | None, gpus: Sequence[str] = ()) -> str:
    """What an entry ran on, as reports name it: the GPU type asked for, else the GPUs of its node, else none."""
    return gpu_type or ", ".join(sorted(set(gpus))) or NO_GPU


@dataclass(frozen=True)
class Night:
    """A night of the history: its id, when it started (UTC) and ``complete``, ``incomplete`` or ``running``."""

    night_id: str
    started: str
    status: str

    @property
    def date(self) -> str:
        return self.started[:10]


@dataclass(frozen=True)
class EntryNight:
    """One model (history key) on one night."""

    night_id: str
    started: str
    status: str  # pass | fail | error | running
    gpu: str  # gpu_label of the entry
    hashes: dict[str, str | None]  # stage -> md5
    figures: dict[str, float]  # qconsist.history.figures
    changed: tuple[str, ...] = ()  # stages whose md5 differs from the key's night before
    previous_status: str | None = None  # the night before's status where this night's differs
    environment: tuple[str, ...] = ()  # what changed in the environment since the key's night before
    baseline_night: str | None = None
    changed_stages: tuple[str, ...] = ()  # stages the gate found changed against the baseline
    first_diverging_node: str | None = None  # against the baseline (the gate's diff evidence)
    origin_nodes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    error: str | None = None
    report: str | None = None  # the entry's report.html, where it exists
    seconds: float | None = None  # the entry task's own wall seconds (None: not measured: it never ran, an older history)

    @property
    def date(self) -> str:
        return self.started[:10]

    @property
    def quantized_md5(self) -> str | None:
        return self.hashes.get(QUANTIZED)

    @property
    def quantized_changed(self) -> bool:
        return QUANTIZED in self.changed

    @property
    def eventful(self) -> bool:
        """Something changed against the night before: a hash, the status or the environment."""
        return bool(self.changed or self.previous_status or self.environment)

    def same_as(self, other: "EntryNight") -> bool:
        """Nothing a reader compares differs from ``other`` (a night before it) and nothing changed on it."""
        return not self.eventful and all(getattr(self, name) == getattr(other, name) for name in _COMPARED)


_COMPARED = ("status", "gpu", "hashes", "figures", "changed_stages", "first_diverging_node", "origin_nodes", "reasons", "error")


@dataclass(frozen=True)
class Series:
    """One history key: a model, or a model on one GPU type (``name@TYPE``), night by night (oldest first)."""

    key: str
    model: str
    nights: tuple[EntryNight, ...]

    @property
    def latest(self) -> EntryNight:
        return self.nights[-1]

    @property
    def gpus(self) -> tuple[str, ...]:
        """The GPU labels of its nights, in the order they first appear."""
        return tuple(dict.fromkeys(n.gpu for n in self.nights))

    def count(self, status: str) -> int:
        return sum(1 for n in self.nights if n.status == status)

    def since(self) -> EntryNight:
        """The first night of the latest run of nights with the latest quantized md5."""
        start = self.latest
        for night in reversed(self.nights):
            if night.quantized_md5 != self.latest.quantized_md5:
                break
            start = night
        return start


@serialized(
    schema=SUMMARY_SCHEMA, derived=("passed",), error=RunStoreError,
    refused="not a history summary of schema {schema!r} (found {found!r})",
    malformed="history summary is malformed: {exc!r}",
)
@dataclass(frozen=True)
class HistorySummary:
    """A history's nights and its series, filtered as asked. ``passed``: every series' latest night passed."""

    source: str
    nights: tuple[Night, ...]
    series: tuple[Series, ...]
    figures: tuple[str, ...]  # the figures any series has, in reading order
    filters: dict[str, Any] = field(default_factory=dict)  # models, gpus, nights: what the summary keeps

    @property
    def passed(self) -> bool:
        return all(s.latest.status == "pass" for s in self.series)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.model for s in self.series))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({gpu for s in self.series for gpu in s.gpus}))


def _status(row: dict[str, Any]) -> str:
    if row["verdict"] is not None:
        return "pass" if row["verdict"]["passed"] else "fail"
    return "running" if row["status"] == "running" else "error"


def _report(entry_run: str | None) -> str | None:
    if not entry_run:
        return None
    path = Path(entry_run) / "report.html"
    return str(path) if path.is_file() else None


def _series(history: History, key: str) -> Series:
    timeline = model_timeline(history, key)
    hash_changes: dict[str, list[str]] = {}
    for change in timeline.changes:
        if change.what == "hash":
            hash_changes.setdefault(change.night_id, []).append(str(change.stage))
    nights = []
    previous: dict[str, Any] | None = None
    for row in timeline.nights:
        verdict = row["verdict"] or {}
        status = _status(row)
        before = _status(previous) if previous is not None else None
        nights.append(EntryNight(
            night_id=row["night_id"], started=row["night_started"], status=status,
            gpu=gpu_label(row["gpu_type"], row["gpus"]),
            hashes={stage: h.get("md5") for stage, h in row["hashes"].items()}, figures=dict(row["figures"]),
            changed=tuple(hash_changes.get(row["night_id"], ())),
            previous_status=before if before is not None and before != status else None,
            environment=tuple(describe_changes(previous["environment"], row["environment"])) if previous is not None else (),
            baseline_night=verdict.get("baseline_night"), changed_stages=tuple(verdict.get("changed_stages") or ()),
            first_diverging_node=verdict.get("first_diverging_node"), origin_nodes=tuple(verdict.get("origin_nodes") or ()),
            reasons=tuple(verdict.get("reasons") or ()), error=row["error"], report=_report(row["entry_run"]),
            seconds=row["seconds"],
        ))
        previous = row
    return Series(key=key, model=key.rsplit("@", 1)[0], nights=tuple(nights))


def summarize_history(history: History, models: Sequence[str] = (), gpus: Sequence[str] = (),
                      nights: int | None = None) -> HistorySummary:
    """Every model's nights in ``history``; only ``models`` (names, or keys ``name@TYPE``), only the nights on
    the GPU types ``gpus`` (as the page labels them: ``H100``, ``none (CPU)``), only the last ``nights`` nights.
    An empty history, a model or GPU type it does not hold, or ``nights`` < 1 is an error saying so."""
    if nights is not None and (isinstance(nights, bool) or not isinstance(nights, int) or nights < 1):
        raise ConfigError(f"`nights` must be a whole number >= 1, got {nights!r}")
    keys = history.models()
    all_nights = history.nights()
    if not keys or not all_nights:
        raise InputError(f"history {history.path} holds no model's night yet; run qconsist nightly first")
    names = sorted({key.rsplit("@", 1)[0] for key in keys})
    for model in models:
        if model not in keys and model not in names:
            raise InputError(f"no nightly history for model '{model}' in {history.path}; models: {', '.join(names)}")
    dead = set(history.abandoned())
    columns = [Night(n["night_id"], n["started"], "incomplete" if n["night_id"] in dead else n["status"]) for n in all_nights]
    if nights is not None:
        columns = columns[-nights:]
    kept = {night.night_id for night in columns}
    chosen = [key for key in keys if not models or key in models or key.rsplit("@", 1)[0] in models]
    series = [_series(history, key) for key in chosen]
    if gpus:
        known = sorted({gpu for s in series for gpu in s.gpus})
        for gpu in gpus:
            if gpu not in known:
                raise InputError(f"no night ran on GPU type '{gpu}' in {history.path}; GPU types: {', '.join(known)}")
    kept_series = []
    for item in series:
        points = tuple(n for n in item.nights if n.night_id in kept and (not gpus or n.gpu in gpus))
        if points:
            kept_series.append(Series(item.key, item.model, points))
    if not kept_series:
        raise InputError(f"history {history.path} holds no night of the models and GPU types asked for in its last "
                         f"{nights} night(s); give more `nights`")
    figures = order(name for s in kept_series for n in s.nights for name in n.figures)
    used = {n.night_id for s in kept_series for n in s.nights}
    return HistorySummary(
        source=str(history.path), nights=tuple(n for n in columns if n.night_id in used or not gpus and not models),
        series=tuple(kept_series), figures=tuple(figures),
        filters={"models": list(models), "gpus": list(gpus), "nights": nights},
    )
