"""A runs directory as a whole: what it holds (``qconsist runs list|show``) and removing runs safely (``rm``).

Each run is described by its kind, model, status — ``complete``, ``incomplete`` (interrupted, killed or
still running), ``modified`` (a file differs from what the manifest recorded, is missing or is refused) or
``invalid`` (a manifest that cannot be read) — its age and its size on disk.

Removal is safe: only run directories, proved to be qconsist's own (``run_evidence``: a manifest of a
``qconsist.run/`` schema, or the ``RUNNING.json`` marker a run writes first) — never another folder (``src/``,
``data/``, a nested runs directory); only direct children of the runs directory, by name; never through a
symbolic link; never a run still being written (its ``RUNNING.json`` names a live process on this host); never a run that the
history names as a baseline (each model's last night whose gate passed, and the runs that night's entry
links) unless forced.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qconsist.errors import ConfigError, RunStoreError
from qconsist.store.confine import MAX_MANIFEST_BYTES, check_relative, confined
from qconsist.store.manifest import MANIFEST_NAME, Manifest
from qconsist.store.rundir import RUNNING_NAME, being_written, run_state
from qconsist.store.serde import loads
from qconsist.store.run import Run
from qconsist.store.verify import COST, check_digest, file_sha256
from qconsist.store.serde import serialized

SCHEMA = "qconsist.runs/1"
VERIFY_SCHEMA = "qconsist.verify/1"
_NOT_RECORDED = ("manifest.json", RUNNING_NAME)
_AGE = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# The one place for the defaults: run directories go in ./runs unless a command, a pipeline or a nightly file
# says otherwise; the history database lies in the runs directory unless one is named.
RUNS_DIR = Path("runs")
HISTORY_FILE = "history.sqlite"


def default_runs_dir(given: Path | None = None) -> Path:
    """``given``, else the default runs directory (``runs``, relative to the working directory)."""
    return RUNS_DIR if given is None else Path(given)


def default_history(runs_dir: Path | None = None, given: Path | None = None) -> Path:
    """``given``, else the history database of ``runs_dir`` (default: the default runs directory)."""
    return Path(given) if given is not None else default_runs_dir(runs_dir) / HISTORY_FILE


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``2w``… in seconds."""
    match = _AGE.match(text.strip())
    if not match:
        raise ConfigError(f"`older_than` {text!r}: write a number and a unit (s, m, h, d, w), e.g. 30d")
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class FileStatus:
    path: str
    status: str  # ok | modified | missing | refused | unrecorded | unverified
    detail: str = ""
    size: int | None = None


@serialized(
    schema=VERIFY_SCHEMA, derived=("passed",), error=RunStoreError,
    refused="verify result schema {found!r} is not {schema!r}", malformed="verify result is malformed: {exc}",
)
@dataclass
class VerifyResult:
    """Every file of one run directory with its status. ``passed``: nothing modified, missing or refused."""

    run: str
    state: str  # complete | incomplete | missing | invalid
    files: list[FileStatus] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    bytes: int = 0

    @property
    def passed(self) -> bool:
        return self.state == "complete" and not self.error and all(
            f.status in ("ok", "unrecorded", "unverified") for f in self.files)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def problems(self) -> list[FileStatus]:
        return [f for f in self.files if f.status in ("modified", "missing", "refused")]

    def summary(self) -> str:
        if self.error:
            return self.error
        if self.problems:
            first = self.problems[0]
            return first.detail
        return f"run {self.run}: {sum(f.status == 'ok' for f in self.files)} file(s) verified"


def _status(run_dir: Path, relative: str, record: dict[str, Any]) -> FileStatus:
    try:
        check_relative(run_dir, relative, "file path")
        if not os.path.lexists(run_dir / relative):
            return FileStatus(relative, "missing", f"run {run_dir}: {relative} is missing", record.get("size"))
        path = confined(run_dir, relative, "file path")
        check_digest(run_dir, relative, str(record.get("sha256")), file_sha256(path))
    except RunStoreError as exc:
        status = "modified" if "modified after the run" in str(exc) else "refused"
        return FileStatus(relative, status, str(exc), record.get("size"))
    return FileStatus(relative, "ok", "", path.stat().st_size)


def _named_paths(manifest: Any) -> list[tuple[str, Any]]:
    """Every path inside the run that a manifest names outside its ``files`` map, with what it is (as the readers
    name it): an inference run's output files, sample tables. (A stage artifact may name the model file an
    inference run ran, outside the run: that one is opened only verified, by ``qconsist.inference.model``.)"""
    named: list[tuple[str, Any]] = []
    inference = manifest.sections.get("inference")
    outputs = inference.get("output_files") if isinstance(inference, dict) else None
    named += [("outputs path", value) for value in (outputs if isinstance(outputs, list) else [])]
    for record in (manifest.inputs, *manifest.inputs.values()):
        if isinstance(record, dict) and "samples" in record:
            named.append(("sample table path", record["samples"]))
    return named


def verify_run(path: Path | str) -> VerifyResult:
    """Check every file a run directory recorded, and list the files it holds that it did not record."""
    run_dir = Path(path)
    start = time.perf_counter()
    bytes_before = COST.bytes
    result = VerifyResult(run=str(run_dir), state="complete")
    try:
        run = Run.open(run_dir)
    except RunStoreError as exc:
        result.error = str(exc)
        result.state = run_state(run_dir)
        if result.state == "complete":
            result.state = "invalid"
        return result
    recorded = run.recorded()
    for relative in sorted(recorded):
        result.files.append(_status(run_dir, relative, recorded[relative]))
    for what, value in _named_paths(run.manifest):  # a path the manifest names is refused as every reader refuses it
        try:
            check_relative(run_dir, value, what)
        except RunStoreError as exc:
            result.files.append(FileStatus(str(value), "refused", str(exc)))
    root = os.path.realpath(run_dir)
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            relative = Path(os.path.join(folder, name)).relative_to(root).as_posix()
            if relative in recorded or relative in _NOT_RECORDED:
                continue
            status = "unrecorded" if run.manifest.files or name.startswith(".") else "unverified"
            result.files.append(FileStatus(relative, status, "not recorded in the manifest"))
    result.seconds = time.perf_counter() - start
    result.bytes = COST.bytes - bytes_before
    return result


def _parse_time(text: Any) -> _dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        value = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc)


def _size(path: Path) -> int:
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


NO_VERDICT = "—"


def run_verdict(manifest: Manifest) -> str:
    """What the run judged, as its manifest recorded it (its ``status`` says only that its files are all there):
    ``PASS``, ``FAIL (check quantize)`` (a pipeline's stage checks below their floor, its repeated calibrations
    disagreeing, or agreeing by chance: ``FAIL (calibration agreed by chance)``), ``FAIL (gate)`` (a nightly
    entry), ``FAIL (1 of 3 models)`` (a night), or ``—`` for a run that
    judges nothing (an inference, locate or sensitivity run)."""
    sections = manifest.sections
    if manifest.kind == "pipeline":
        failed: list[str] = []
        judged = False
        for stage in manifest.stages:
            checks = stage.get("checks") if isinstance(stage, dict) else None
            for check in (checks.values() if isinstance(checks, dict) else ()):
                if isinstance(check, dict) and isinstance(check.get("passed"), bool):
                    judged = True
                    if not check["passed"] and f"check {stage.get('name')}" not in failed:
                        failed.append(f"check {stage.get('name')}")
        repeat = sections.get("calib_repeat")
        if isinstance(repeat, dict) and isinstance(repeat.get("agree"), bool):
            judged = True
            # ``passed`` (written since the by-chance finding): the md5s agree and no calibrated tensor's producer
            # varies run to run; records written before it say only ``agree``
            passed = repeat.get("passed")
            if not repeat["agree"]:
                failed.append("calibration repeat")
            elif passed is False:
                failed.append("calibration agreed by chance")
        return f"FAIL ({', '.join(failed)})" if failed else ("PASS" if judged else NO_VERDICT)
    gate = sections.get("gate")
    if isinstance(gate, dict) and isinstance(gate.get("passed"), bool):
        return "PASS" if gate["passed"] else "FAIL (gate)"
    entries = _night_entries(manifest)
    if entries:
        failing = [e for e in entries if e.get("status") != "pass"]
        return f"FAIL ({len(failing)} of {len(entries)} models)" if failing else "PASS"
    return NO_VERDICT


def _night_entries(manifest: Manifest) -> list[dict[str, Any]]:
    night = manifest.sections.get("nightly") if manifest.kind == "nightly" else None
    entries = night.get("entries") if isinstance(night, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def run_model(manifest: Manifest) -> str:
    """The model a run ran: its manifest's model name; a night's, the models of its entries (it runs several)."""
    name = manifest.model.get("name") if isinstance(manifest.model, dict) else None
    if name:
        return str(name)
    models = [str(e["model"]) for e in _night_entries(manifest) if e.get("model")]
    return ",".join(models[:2]) + (f" +{len(models) - 2} more" if len(models) > 2 else "")


@serialized
@dataclass
class RunInfo:
    """One run directory of a runs directory."""

    name: str
    path: str
    kind: str
    model: str
    status: str  # complete | incomplete | modified | invalid
    started: str
    age_seconds: float
    size: int
    verdict: str = NO_VERDICT  # what the run judged (``run_verdict``); a complete run may have failed its checks
    baseline: bool = False  # named by the history as a model's baseline
    running: bool = False  # RUNNING.json names a live process on this host
    detail: str = ""


def describe_run(path: Path, verify: bool = True, now: _dt.datetime | None = None) -> tuple[RunInfo, VerifyResult | None]:
    """What one run directory is; with ``verify``, every recorded file checked (``modified`` if not)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    path = Path(path)
    state = run_state(path)
    kind = model = started = detail = ""
    verdict = NO_VERDICT
    running = False
    checked: VerifyResult | None = None
    if state == "complete":
        try:
            run = Run.open(path)
            kind, started = run.kind, run.manifest.started
            model, verdict = run_model(run.manifest), run_verdict(run.manifest)
            status = "complete"
            if verify:
                checked = verify_run(path)
                if not checked.passed:
                    status, detail = "modified", checked.summary()
        except RunStoreError as exc:
            status, detail = "invalid", str(exc)
    elif state == "missing":
        raise RunStoreError(f"run directory {path} does not exist")
    elif run_evidence(path) is None:
        status, detail = "invalid", "not a run directory (no qconsist manifest, no RUNNING.json marker)"
        if os.path.lexists(path / MANIFEST_NAME):  # a manifest that cannot be read: say why
            try:
                Manifest.load(path / MANIFEST_NAME)
            except RunStoreError as exc:
                detail = str(exc)
    else:
        status = "incomplete"
        running, detail, started, kind = being_written(path)
        detail = detail or "interrupted or killed"
    when = _parse_time(started)
    if when is None:
        try:
            when = _dt.datetime.fromtimestamp(path.lstat().st_mtime, _dt.timezone.utc)
        except OSError:
            when = now
    info = RunInfo(name=path.name, path=str(path), kind=kind or "?", model=model or "?", status=status,
                   verdict=verdict, started=started, age_seconds=max(0.0, (now - when).total_seconds()), size=_size(path),
                   running=running, detail=detail)
    return info, checked


def find_run(run: Path | str, runs_root: Path) -> Path:
    """A run directory given as a path, or by its name inside ``runs_root`` (as ``runs list`` prints it)."""
    path = Path(run)
    if not path.is_dir() and len(path.parts) == 1 and (Path(runs_root) / path).is_dir():
        return Path(runs_root) / path
    if not path.is_dir():
        raise RunStoreError(f"run directory {path} does not exist" + ("" if len(path.parts) > 1 else f" (nor {Path(runs_root) / path})"))
    return path


def _children(runs_root: Path) -> list[Path]:
    if not runs_root.is_dir():
        raise RunStoreError(f"runs directory {runs_root} does not exist")
    return sorted(p for p in runs_root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))


@serialized(schema=SCHEMA)
@dataclass
class RunsListing:
    runs_dir: str
    runs: list[RunInfo] = field(default_factory=list)


def list_runs_dir(runs_root: Path, baselines: set[str] = frozenset(), verify: bool = True) -> RunsListing:
    """Every run of ``runs_root``; ``baselines``: the names the history holds as baselines
    (``qconsist.history.baseline_runs``)."""
    runs_root = Path(runs_root)
    protected = set(baselines)
    listing = RunsListing(str(runs_root))
    for path in _children(runs_root):
        info, _ = describe_run(path, verify)
        info.baseline = path.name in protected
        listing.runs.append(info)
    return listing


@serialized(schema=SCHEMA)
@dataclass
class Removal:
    """What ``rm`` removed, and what it kept and why."""

    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    freed: int = 0
    dry_run: bool = False


NOT_A_RUN = "not a run directory (no qconsist manifest, no RUNNING.json marker); never removed"


def _json_file(path: Path, limit: int) -> Any:
    """The JSON data of the regular file ``path`` (not a link, at most ``limit`` bytes), else None."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def run_evidence(path: Path) -> str | None:
    """What proves ``path`` is a run directory qconsist wrote: ``"manifest"`` (a ``manifest.json`` of a
    ``qconsist.run/`` schema, whatever its status), ``"marker"`` (the ``RUNNING.json`` a run writes before
    anything else: its run id, kind, start and writer), else None — a folder qconsist did not make."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return None
    manifest = _json_file(path / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    if isinstance(manifest, dict) and isinstance(manifest.get("schema"), str) and manifest["schema"].startswith("qconsist.run/"):
        return "manifest"
    marker = _json_file(path / RUNNING_NAME, 1 << 20)
    if (isinstance(marker, dict) and all(isinstance(marker.get(k), str) and marker[k] for k in ("run_id", "kind", "started"))
            and isinstance(marker.get("pid"), int)):
        return "marker"
    return None


def remove_runs(runs_root: Path, names: list[str], incomplete: bool = False, older_than: float | None = None,
                baselines: set[str] = frozenset(), force: bool = False, dry_run: bool = False) -> Removal:
    """Remove the runs ``names`` (directory names in ``runs_root``), or with ``incomplete`` every incomplete
    run, and/or with ``older_than`` (seconds) every run older than that. Only run directories are removed
    (``run_evidence``): a folder named that is not one is refused, one found in the runs directory is kept. A
    run being written is never removed; a baseline the history names (``baselines``) only with ``force``."""
    runs_root = Path(runs_root)
    if not names and not incomplete and older_than is None:
        raise ConfigError("say which runs to remove: names, `incomplete` or `older_than`")
    protected = set(baselines)
    candidates: list[Path] = []
    for name in names:
        check_relative(runs_root, name, "run name")
        if "/" in name:
            raise ConfigError(f"{name!r}: give the name of a run directory inside {runs_root}, not a path")
        path = runs_root / name
        if path.is_symlink():
            raise RunStoreError(f"{path} is a symbolic link, not a run directory; refused")
        if not path.is_dir():
            raise RunStoreError(f"run directory {path} does not exist")
        if run_evidence(path) is None:
            raise RunStoreError(f"{path} is {NOT_A_RUN}; refused")
        candidates.append(path)
    if not names:
        candidates = _children(runs_root)
    result = Removal(dry_run=dry_run)
    for path in candidates:
        if run_evidence(path) is None:
            result.kept[path.name] = NOT_A_RUN
            continue
        info, _ = describe_run(path, verify=False)
        selected = bool(names) or (incomplete and info.status == "incomplete") or (
            older_than is not None and info.age_seconds > older_than)
        if names and (incomplete or older_than is not None):
            selected = (incomplete and info.status == "incomplete") or (older_than is not None and info.age_seconds > older_than)
        if not selected:
            continue
        if info.running:
            result.kept[path.name] = info.detail
            continue
        if info.status == "incomplete" and os.path.lexists(path / MANIFEST_NAME):
            # it finished while it was looked at: a run writes its manifest before it removes its RUNNING.json, so
            # a marker gone when read with a manifest there now is a complete run, not an interrupted one
            continue
        if path.name in protected and not force:
            result.kept[path.name] = "the history names it as a baseline (--force removes it)"
            continue
        result.freed += info.size
        result.removed.append(path.name)
        if not dry_run:
            shutil.rmtree(path)
    return result
