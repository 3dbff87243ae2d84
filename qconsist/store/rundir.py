"""Run directories: ``runs/<run-id>/`` with artifacts and a ``manifest.json`` written last.

Life of a run directory:

1. ``RunDirectory.create`` makes the folder under a hidden temporary name, writes ``RUNNING.json`` in it (run id,
   kind, start time and the writer: pid, host, process start), then renames it ``runs/<run-id>/``: the run
   directory appears with its marker, so ``runs rm --incomplete`` never takes a starting run for an abandoned
   one (a folder without a marker or a manifest is not a run, and is never removed either).
2. The work writes artifacts into it, each atomically.
3. ``finish(manifest)`` writes ``manifest.json`` atomically, then removes ``RUNNING.json``. Only a directory
   with a valid ``manifest.json`` whose ``status`` is ``complete`` is a complete run.
4. If the work fails with a user error, ``abandon()`` removes the directory: nothing half-written stays.
   If the process is killed, the directory keeps ``RUNNING.json`` and no manifest, and every reader reports
   it as incomplete; ``being_written`` tells whether its writer still runs (``qconsist.store.liveness``).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from qconsist.store.serde import loads
from qconsist.limits import shorten
from qconsist.errors import OutputError, QconsistError, RunStoreError
from qconsist.store.atomic import OPEN_RUNS, _umask, write_json_atomic
from qconsist.store.confine import MAX_MANIFEST_BYTES, confined
from qconsist.store.liveness import identity, writer_running
from qconsist.store.manifest import MANIFEST_NAME, Manifest
from qconsist.store.scratch import NO_SPACE, scratch_root
from qconsist.store.verify import record_files

RUNNING_NAME = "RUNNING.json"
_OPEN = OPEN_RUNS  # run directories this process is writing (created, not yet finished, abandoned or left)
_RUN_ID_MAX = 201  # characters: a folder name fits any file system (255 bytes) with room for a temporary name
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_STAMP_CHARS = len("-20260101T000000-abcdef")
MAX_LABEL = _RUN_ID_MAX - _STAMP_CHARS  # characters of a label (a pipeline's name) in ``new_run_id``


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _run_id_problem(run_id: str) -> str:
    """What is wrong with a run id that ``_RUN_ID_RE`` refuses, said as it is."""
    if len(run_id) > _RUN_ID_MAX:
        return (f"it is {len(run_id)} characters long; a run id has at most {_RUN_ID_MAX} (a label such as a pipeline's "
                f"name at most {MAX_LABEL}, the rest is its time and a random suffix)")
    if run_id in (".", ".."):
        return (f"it names the runs directory{' itself' if run_id == '.' else chr(39) + 's parent'}, not a folder inside it; "
                "a run id starts with a letter or digit")
    if re.fullmatch(r"[A-Za-z0-9._-]+", run_id) and run_id.startswith((".", "_", "-")):
        return f"it starts with {run_id[0]!r}; a run id starts with a letter or digit"
    return "use letters, digits, '.', '_' and '-'"


def new_run_id(label: str) -> str:
    """``<label>-<UTC timestamp>-<random>``, sortable by time, unique across parallel runs."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") or "run"
    return f"{safe}-{stamp}-{secrets.token_hex(3)}"


@dataclass
class RunDirectory:
    """A run directory being written. Use as a context manager: a user error abandons it."""

    path: Path
    run_id: str
    started: str
    keep_on_error: bool = False

    @classmethod
    def create(cls, runs_root: Path, label: str, kind: str, run_id: str | None = None) -> "RunDirectory":
        runs_root = Path(runs_root)
        run_id = run_id or new_run_id(label)
        if not _RUN_ID_RE.match(run_id):
            raise OutputError(f"invalid run id {shorten(run_id)!r}: {_run_id_problem(run_id)}")
        path = runs_root / run_id
        started = utc_now()
        try:
            runs_root.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(path):
                raise FileExistsError(path)
            staging = Path(tempfile.mkdtemp(prefix=f".{run_id}.", suffix=".creating", dir=runs_root))
        except FileExistsError as exc:
            raise OutputError(f"run directory {path} already exists; choose another `run_id`") from exc
        except OSError as exc:
            raise OutputError(f"cannot create run directory in {runs_root}: {exc.strerror or exc}") from exc
        try:
            os.chmod(staging, 0o777 & ~_umask())  # a folder as mkdir makes it, not mkdtemp's 0700
            write_json_atomic(staging / RUNNING_NAME, {"run_id": run_id, "kind": kind, **identity(), "started": started})
            _OPEN.add(os.path.realpath(path))
            os.rename(staging, path)  # fails on a folder made meanwhile that is not empty
        except BaseException as exc:
            _OPEN.discard(os.path.realpath(path))
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError) and not isinstance(exc, OutputError) and os.path.lexists(path):
                raise OutputError(f"run directory {path} already exists; choose another `run_id`") from None
            if isinstance(exc, OSError) and not isinstance(exc, OutputError):
                raise OutputError(f"cannot create run directory in {runs_root}: {exc.strerror or exc}") from None
            raise
        return cls(path=path, run_id=run_id, started=started)

    def file(self, relative: str) -> Path:
        target = self.path / relative
        if not self.path.is_dir():
            raise OutputError(f"cannot write {target}: its run directory {self.path} was removed while being written")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def mark_progress(self, stage: str) -> None:
        """Note in RUNNING.json which step is under way, so an interrupted run says where it stopped."""
        marker = self.path / RUNNING_NAME
        try:
            data = loads(marker.read_text())
        except (OSError, ValueError):
            data = {"run_id": self.run_id}
        data["stage"] = stage
        data["updated"] = utc_now()
        write_json_atomic(marker, data)

    def finish(self, manifest: Manifest) -> Path:
        manifest.run_id = self.run_id
        manifest.started = manifest.started or self.started
        manifest.finished = utc_now()
        manifest.status = "complete"
        manifest.files = record_files(self.path)
        write_json_atomic(self.path / MANIFEST_NAME, manifest.to_json())
        (self.path / RUNNING_NAME).unlink(missing_ok=True)
        _OPEN.discard(os.path.realpath(self.path))
        return self.path

    def abandon(self) -> None:
        _OPEN.discard(os.path.realpath(self.path))
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "RunDirectory":
        self._scratch = scratch_root(self.path)
        self._scratch.__enter__()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        # a failure while the disk holding the run is full is said as such: the tools that write (onnx,
        # onnxruntime's quantizer) report it as a broken model or without a path
        full = disk_full(self.path) if isinstance(exc, Exception) and not isinstance(exc, OutputError) else None
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            scratch.__exit__(exc_type, exc, tb)  # temporary files go, whatever happened
        _OPEN.discard(os.path.realpath(self.path))  # interrupted: kept, and no longer being written
        if exc is None or self.keep_on_error:
            return
        if isinstance(exc, Exception):  # a user error or a bug: nothing half-written stays; an interrupt keeps it
            self.abandon()
        if full is not None:
            what = exc.message if isinstance(exc, QconsistError) else " ".join(f"{type(exc).__name__}: {exc}".split())
            raise OutputError(f"cannot write in {self.path}: the disk is full ({full} bytes free there); "
                              f"what failed: {what}") from None


PROBE_BYTES = 1 << 16


def disk_full(folder: Path) -> int | None:
    """The free bytes of ``folder``'s file system when ``PROBE_BYTES`` cannot be written there for want of space
    (a real allocation, not a guess from the free count), else None."""
    try:
        fd, name = tempfile.mkstemp(prefix=".qconsist-space-", dir=folder)
    except OSError as exc:
        return _free(folder) if exc.errno in NO_SPACE else None
    try:
        os.posix_fallocate(fd, 0, PROBE_BYTES)
    except OSError as exc:
        return _free(folder) if exc.errno in NO_SPACE else None
    finally:
        os.close(fd)
        Path(name).unlink(missing_ok=True)
    return None


def _free(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


def run_state(path: Path) -> str:
    """``complete``, ``incomplete`` (interrupted or being written) or ``missing``."""
    path = Path(path)
    if not path.is_dir():
        return "missing"
    manifest = path / MANIFEST_NAME
    if manifest.is_file() and not manifest.is_symlink():
        try:
            if manifest.stat().st_size > MAX_MANIFEST_BYTES:
                return "incomplete"
            data = loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "incomplete"
        if isinstance(data, dict) and data.get("status") == "complete":
            return "complete"
    return "incomplete"


def being_written(path: Path) -> tuple[bool, str, str, str]:
    """Whether a live process writes the run directory ``path`` (its ``RUNNING.json`` names it), with what to
    say about it, when it started and its kind; ``(False, "", "", "")`` without a readable marker."""
    marker = Path(path) / RUNNING_NAME
    try:
        if marker.is_symlink() or not marker.is_file() or marker.stat().st_size > 1 << 20:
            return False, "", "", ""
        data = loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False, "", "", ""
    if not isinstance(data, dict):
        return False, "", "", ""
    alive, detail = writer_running(data, os.path.realpath(path) in _OPEN)
    return alive, detail, str(data.get("started") or ""), str(data.get("kind") or "")


def _refuse_folder_of_runs(path: Path) -> None:
    """A folder with neither manifest nor marker whose subfolders are runs (``runs/``) is a folder of runs, not an
    interrupted run: say so, naming one or two of its runs (complete ones first) to give instead."""
    try:
        children = sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                          and ((p / MANIFEST_NAME).is_file() or (p / RUNNING_NAME).is_file()))
    except OSError:
        return
    if not children:
        return
    examples = sorted(children, key=lambda p: run_state(p) != "complete")[:2]
    raise RunStoreError(f"{path} is a folder of {len(children)} run(s), not a run; give one of them, e.g. "
                        + " or ".join(str(p) for p in examples))


def open_run(path: Path) -> Manifest:
    """Load a complete run's manifest (read once), or raise a one-line ``RunStoreError`` saying why not."""
    path = Path(path)
    if not path.is_dir():
        raise RunStoreError(f"run directory {path} does not exist")
    manifest_path = path / MANIFEST_NAME
    running = (path / RUNNING_NAME).exists()
    if os.path.lexists(manifest_path):
        confined(path, MANIFEST_NAME, "manifest", limit=MAX_MANIFEST_BYTES)  # a link outside, a device: refused
        try:
            manifest = Manifest.load(manifest_path)
        except RunStoreError:
            if not running:
                raise  # a damaged manifest says what is wrong with it
            manifest = None  # being written
        if manifest is not None and manifest.status == "complete":
            return manifest
    if not running and not os.path.lexists(manifest_path):
        _refuse_folder_of_runs(path)
    where = ""
    marker = path / RUNNING_NAME
    if running and marker.is_file() and not marker.is_symlink() and marker.stat().st_size < 1 << 20:
        try:
            info = loads(marker.read_text())
            where = f" (started {info.get('started', '?')}, last step {info.get('stage', 'start')})"
        except (OSError, ValueError, AttributeError):
            pass
    raise RunStoreError(f"run {path} is incomplete{where}: it was interrupted or is still running; rerun it")


def same_run(path_a: Path, a: Manifest, path_b: Path, b: Manifest) -> bool:
    """Whether two run directories are one run: the same folder (by any path), or a copy of it (same run id and
    start time in the manifest)."""
    try:
        if os.path.samefile(path_a, path_b):
            return True
    except OSError:
        pass
    return bool(a.run_id) and a.run_id == b.run_id and a.started == b.started


def list_runs(runs_root: Path) -> list[tuple[Path, str]]:
    """Every run directory under ``runs_root`` with its state, oldest first by name."""
    runs_root = Path(runs_root)
    if not runs_root.is_dir():
        return []
    return [(p, run_state(p)) for p in sorted(runs_root.iterdir()) if p.is_dir() and not p.name.startswith(".")]
