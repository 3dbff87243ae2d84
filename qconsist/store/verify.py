"""Verify on read: the files of a run directory are checked against the sha256 its manifest recorded.

``RunDirectory.finish`` records every file of a run (``files`` in the manifest: path -> md5, sha256, size;
md5 for users' scripts, sha256 for qconsist). A command that reads a run uses ``run_file`` for every file it
opens or whose recorded hash it trusts: the path is confined to the run directory (``confine.confined``) and
the file's sha256, streamed, must equal the recorded one — else one line, "run X: quantize/model.onnx was
modified after the run (sha256 … recorded, … found)", exit 2. A file is hashed once per command: results
are kept per (device, inode, size, mtime, ctime), so a replaced or rewritten file is hashed again.

Runs written before ``files`` existed are verified through what they did record (every stage artifact's
sha256); their other files are listed as ``unrecorded`` by ``verify_run``.

An inference run names the model it ran by absolute path (the model is not copied into it): such an
*external* file is opened only when it is a regular file of the recorded size, and used only when its
sha256 is the recorded one; the external data files such a model names (``external_data`` in its artifact record:
location relative to the model's folder, size, sha256) are checked the same way, and a location outside the
model's folder is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qconsist.errors import RunStoreError
from qconsist.store.confine import confined, max_file_bytes
from qconsist.store.hashing import hash_file, inside_folder
from qconsist.store.manifest import MANIFEST_NAME, Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG_NAME

log = logging.getLogger(__name__)

# not recorded: the manifest itself, the running marker, and onnxruntime's log (descriptor 2 still points at it
# while the run finishes, and it is removed when empty): a diagnostic no reader relies on
_NOT_RECORDED = (MANIFEST_NAME, "RUNNING.json", ORT_LOG_NAME)
_KINDS_HOLDING_STAGES = ("pipeline",)  # runs whose stage artifacts are files of their own
_CACHE: dict[tuple[int, ...], str] = {}


@dataclass
class HashCost:
    """What verification cost in this process: files hashed, bytes read, seconds (``verification_cost``)."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    cached: int = 0


COST = HashCost()


def _key(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def file_sha256(path: Path) -> str:
    """sha256 of a regular file, streamed; once per file per process unless the file changes."""
    try:
        before = os.stat(path)
    except OSError as exc:
        raise RunStoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    cached = _CACHE.get(_key(before))
    if cached is not None:
        COST.cached += 1
        return cached
    start = time.perf_counter()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise RunStoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise RunStoreError(f"{path} is not a regular file; refused")
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    _CACHE[_key(info)] = digest
    COST.files += 1
    COST.bytes += info.st_size
    COST.seconds += time.perf_counter() - start
    return digest


def _short(digest: str) -> str:
    return f"{digest[:12]}…"


def recorded_files(manifest: Manifest) -> dict[str, dict[str, Any]]:
    """The files a run holds with their recorded hashes: ``files``, or for runs written before it, the
    stage artifacts of a pipeline run."""
    if manifest.files:
        return manifest.files
    found: dict[str, dict[str, Any]] = {}
    if manifest.kind in _KINDS_HOLDING_STAGES:
        for stage in manifest.stages:
            artifact = stage.get("artifact")
            if isinstance(artifact, dict) and isinstance(artifact.get("path"), str) and isinstance(artifact.get("sha256"), str):
                found[artifact["path"]] = {"sha256": artifact["sha256"], "size": artifact.get("size")}
    return found


def check_digest(run_dir: Path, relative: str, recorded: str, found: str) -> None:
    if found != recorded:
        raise RunStoreError(f"run {run_dir}: {relative} was modified after the run (sha256 {_short(recorded)} recorded, "
                            f"{_short(found)} found)")


def run_file(run_dir: Path, manifest: Manifest, relative: Any, what: str = "path") -> Path:
    """The file ``relative`` of a complete run, confined to it and verified against its recorded sha256.

    A file that the manifest's ``files`` does not list is refused (it was added after the run), unless the
    run predates ``files``."""
    run_dir = Path(run_dir)
    path = confined(run_dir, relative, what)
    record = recorded_files(manifest).get(relative)
    if record is None:
        if manifest.files:
            raise RunStoreError(f"run {run_dir}: {relative} is not one of the files the run recorded (added after the "
                                "run?); refused")
        log.info("run %s: %s has no recorded hash (a run written before qconsist recorded every file)", run_dir, relative)
        return path
    check_digest(run_dir, relative, str(record.get("sha256")), file_sha256(path))
    return path


def optional_run_file(run_dir: Path, manifest: Manifest, relative: str) -> Path | None:
    """``run_file``, or ``None`` when the run neither holds nor records the file (optional raw tensors)."""
    if relative not in recorded_files(manifest) and not os.path.lexists(Path(run_dir) / relative):
        return None
    return run_file(run_dir, manifest, relative)


def stage_artifact(run_dir: Path, manifest: Manifest, stage: str) -> Path | None:
    """The verified model file of a stage: inside the run for a pipeline run; for an inference run (which
    records the stages of the run it came from), the external model, verified (``None`` when it is gone)."""
    record = manifest.stage(stage)
    artifact = record.get("artifact") if record else None
    if not isinstance(artifact, dict):
        return None
    where = f"{stage} artifact path"
    path = artifact.get("path")
    if manifest.kind in _KINDS_HOLDING_STAGES or not (isinstance(path, str) and path.startswith("/")):
        found = run_file(run_dir, manifest, path, where)
        if isinstance(artifact.get("sha256"), str):  # the stage's own record must tell the same
            check_digest(run_dir, path, artifact["sha256"], file_sha256(found))
        return found
    return external_file(run_dir, artifact, where)


def external_file(run_dir: Path, record: dict[str, Any], what: str) -> Path | None:
    """A model an inference run ran, named by absolute path with its size and sha256: ``None`` when it is
    gone; refused when it is not a regular file of the recorded size or its sha256 differs."""
    path, size, sha = record.get("path"), record.get("size"), record.get("sha256")
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise RunStoreError(f"run {run_dir}: the manifest's {what} is {path!r}, not an absolute path to a model")
    if not isinstance(size, int) or not isinstance(sha, str):
        raise RunStoreError(f"run {run_dir}: the manifest records no size and sha256 for {path}; refused")
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        raise RunStoreError(f"run {run_dir}: the model it ran, {path}, was modified after the run (size {size} recorded, "
                            f"{info.st_size if stat.S_ISREG(info.st_mode) else 'not a regular file'} found)")
    found = file_sha256(Path(path))
    if found != sha:
        raise RunStoreError(f"run {run_dir}: the model it ran, {path}, was modified after the run (sha256 {_short(sha)} "
                            f"recorded, {_short(found)} found)")
    if "external_data" in record:  # runs written before qconsist recorded a model's external data have none
        _external_data(run_dir, Path(path), record["external_data"])
    return Path(path)


def _external_data(run_dir: Path, model: Path, files: Any) -> None:
    """Each external data file an inference run's model names, at its recorded size and sha256: the weights the
    run ran (an artifact is its whole content)."""
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise RunStoreError(f"run {run_dir}: the manifest's record of the external data of {model} is damaged")
    for record in files:
        location, size, sha = record.get("location"), record.get("size"), record.get("sha256")
        path = inside_folder(model.parent, location)
        if path is None:
            raise RunStoreError(f"run {run_dir}: the manifest names external data {location!r} of {model} outside the "
                                "model's folder; refused")
        if not isinstance(size, int) or not isinstance(sha, str):
            raise RunStoreError(f"run {run_dir}: the manifest records no size and sha256 for the external data "
                                f"{location} of {model}; refused")
        try:
            info = os.stat(path)
            found_size: Any = info.st_size if stat.S_ISREG(info.st_mode) else "not a regular file"
        except OSError:
            found_size = "no file"
        if found_size != size:
            raise RunStoreError(f"run {run_dir}: external data {location} of the model it ran, {model}, changed since "
                                f"the run (size {size} recorded, {found_size} found)")
        found = file_sha256(path.resolve())  # a link inside the folder: its target (``inside_folder`` kept it there)
        if found != sha:
            raise RunStoreError(f"run {run_dir}: external data {location} of the model it ran, {model}, changed since "
                                f"the run (sha256 {_short(sha)} recorded, {_short(found)} found)")


def verify_artifacts(run_dir: Path, manifest: Manifest) -> None:
    """Every model artifact a run holds, verified: what a command checks before trusting recorded hashes."""
    if manifest.kind not in _KINDS_HOLDING_STAGES:
        return
    for stage in manifest.stages:
        if isinstance(stage.get("artifact"), dict):
            stage_artifact(run_dir, manifest, stage["name"])


# --- recording (at write time; ``qconsist.store.runs.verify_run`` is the on-demand check) -----------------------


def record_files(run_dir: Path) -> dict[str, dict[str, Any]]:
    """md5, sha256 and size of every file of a run directory being finished (not the manifest, the
    running marker or temporary files), by relative POSIX path."""
    run_dir = Path(run_dir)
    files: dict[str, dict[str, Any]] = {}
    for folder, dirs, names in os.walk(run_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .scratch and other temporary folders
        for name in sorted(names):
            path = Path(folder) / name
            relative = path.relative_to(run_dir).as_posix()
            if relative in _NOT_RECORDED or name.startswith("."):
                continue
            if path.is_symlink() or not path.is_file():
                continue
            hashes = hash_file(path)
            files[relative] = {"sha256": hashes.sha256, "md5": hashes.md5, "size": hashes.size}
    return files


def reset_cache() -> None:
    """Forget what was hashed (tests, and long-lived processes between commands)."""
    _CACHE.clear()
    COST.files = COST.bytes = COST.cached = 0
    COST.seconds = 0.0


__all__ = [
    "COST", "external_file", "file_sha256", "max_file_bytes", "optional_run_file", "record_files", "reset_cache",
    "run_file", "stage_artifact", "verify_artifacts",
]
