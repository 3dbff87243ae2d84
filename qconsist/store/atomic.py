"""Atomic file writes: a reader sees the old file or the whole new one, never a half-written one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from qconsist.errors import OutputError
from qconsist.store.serde import dumps

# Run directories this process is writing (real paths; ``qconsist.store.rundir`` adds and discards them). A
# write inside one whose folder is gone (``runs rm`` of an abandoned run, by hand) fails: the folders of a
# removed run are never made again.
OPEN_RUNS: set[str] = set()


def _removed_run(path: Path) -> str | None:
    """The run directory this process is writing that ``path`` lies in, where that folder no longer exists."""
    if not OPEN_RUNS:
        return None
    real = os.path.realpath(path.parent)
    for run in OPEN_RUNS:
        if (real == run or real.startswith(run + os.sep)) and not os.path.isdir(run):
            return run
    return None


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask: read from /proc where it is shown (setting it to read it races with threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, writer: Callable[[Path], None], make_parents: bool = True) -> None:
    """Call ``writer(tmp)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``. The file
    gets the permissions a plain ``open`` would give it (0666 less the umask), not mkstemp's 0600.
    ``make_parents=False``: a missing parent folder is an error, not created (outputs outside the runs folder)."""
    path = Path(path)
    try:
        removed = _removed_run(path) if make_parents else None
        if removed is not None:
            raise OutputError(f"cannot write {path}: its run directory {removed} was removed while being written")
        if make_parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.parent.is_dir():
            raise OutputError(f"cannot write {path}: folder {path.parent} does not exist")
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~_umask())
        finally:
            os.close(fd)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    tmp = Path(tmp_name)
    try:
        writer(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` (anything ``qconsist.store.serde`` writes: results, dicts with non-finite floats) as JSON."""

    text = dumps(data)
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
