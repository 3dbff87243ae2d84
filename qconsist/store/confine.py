"""Confinement: a path a run directory names stays inside it, and the files it names are what they claim.

A run directory is something users copy between machines, attach to tickets and keep for months; what it
*says* is not trusted. ``confined(run_dir, relative)`` turns a path recorded in a manifest into a file inside
the run directory, refusing in one line:

* anything but a relative, normalised POSIX path (absolute paths, ``..``, ``.``, empty components,
  backslashes, NUL);
* a symbolic link (any component) that points outside the run directory;
* anything but a regular file (a device, a pipe, a socket, a directory);
* a file larger than ``MAX_FILE_BYTES`` (``QCONSIST_MAX_FILE_BYTES`` overrides it).

Array files are checked before numpy reads them: a ``.npy`` header must agree with the file's size (a
header that lies about its shape or dtype is refused, never read past its end, never allocated), and every
member of a ``.npz`` likewise (``check_npz``). Only ``os.lstat``/``os.stat``/``realpath`` look at the disk
before a file is accepted: nothing is opened on the way.
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.errors import ConfigError, QconsistError, RunStoreError
from qconsist.limits import shorten

MAX_FILE_BYTES = 64 << 30  # 64 GiB: a 256-sample raw dump of a large model stays below it
MAX_MANIFEST_BYTES = 256 << 20


def max_file_bytes() -> int:
    """``QCONSIST_MAX_FILE_BYTES`` (a positive number of bytes), else ``MAX_FILE_BYTES``; any other value is refused,
    never replaced by the default."""
    value = os.environ.get("QCONSIST_MAX_FILE_BYTES")
    if value is None or not value.strip():
        return MAX_FILE_BYTES
    try:
        limit = int(value.strip())
    except ValueError:
        limit = 0
    if limit <= 0:
        raise ConfigError(f"QCONSIST_MAX_FILE_BYTES={shorten(value, 40)!r}: give the largest file qconsist reads, a positive "
                          f"number of bytes (default {MAX_FILE_BYTES})")
    return limit


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_relative(run_dir: Path, relative: Any, what: str = "path") -> list[str]:
    """The components of ``relative`` if it is a relative, normalised path; else ``RunStoreError``."""
    if not isinstance(relative, str) or not relative:
        raise RunStoreError(f"run {run_dir}: the manifest's {what} is {relative!r}, not a path inside the run directory")
    shown = relative if len(relative) <= 120 else relative[:117] + "..."
    if "\x00" in relative or "\\" in relative:
        raise RunStoreError(f"run {run_dir}: the manifest's {what} {shown!r} is not a plain relative path")
    if relative.startswith("/") or (len(relative) > 1 and relative[1] == ":"):
        raise RunStoreError(f"run {run_dir}: the manifest's {what} {shown!r} is absolute; paths in a run directory "
                            "are relative to it")
    parts = relative.split("/")
    if ".." in parts:
        raise RunStoreError(f"run {run_dir}: the manifest's {what} {shown!r} leaves the run directory ('..')")
    if any(part in ("", ".") for part in parts):
        raise RunStoreError(f"run {run_dir}: the manifest's {what} {shown!r} is not normalised")
    return parts


def confined(run_dir: Path, relative: Any, what: str = "path", limit: int | None = None) -> Path:
    """The regular file ``relative`` names inside ``run_dir`` (see the module docstring), or ``RunStoreError``.

    Raises ``FileNotFoundError``-free: a missing file is a ``RunStoreError`` too ("… is missing")."""
    parts = check_relative(run_dir, relative, what)
    root = os.path.realpath(run_dir)
    current, linked = root, False
    for part in parts:
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            raise RunStoreError(f"run {run_dir}: {relative} is missing") from None
        except OSError as exc:
            raise RunStoreError(f"run {run_dir}: cannot read {relative}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(info.st_mode):
            target = os.path.realpath(current)
            if not _inside(target, root):
                raise RunStoreError(f"run {run_dir}: {relative} is a symbolic link pointing outside the run directory "
                                    f"(to {target}); refused")
            current, linked = target, True
    real = os.path.realpath(current) if linked else current
    if not _inside(real, root):  # pragma: no cover - every component was checked above
        raise RunStoreError(f"run {run_dir}: {relative} resolves outside the run directory; refused")
    try:
        info = os.stat(real)
    except OSError as exc:
        raise RunStoreError(f"run {run_dir}: cannot read {relative}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise RunStoreError(f"run {run_dir}: {relative} is {_kind(info.st_mode)}; refused")
    limit = max_file_bytes() if limit is None else limit
    if info.st_size > limit:
        raise RunStoreError(f"run {run_dir}: {relative} is {info.st_size} bytes, more than the limit of {limit} "
                            "(QCONSIST_MAX_FILE_BYTES); refused")
    return Path(real)


def linked_run(run_dir: Path, value: Any, what: str) -> Path:
    """A run that ``run_dir``'s manifest names (a nightly entry's pipeline, inference or locate run): a
    sibling directory in the same runs directory, by name (or a path whose last part is that name)."""
    if not isinstance(value, str) or not value:
        raise RunStoreError(f"run {run_dir}: the manifest's {what} is {value!r}, not a run name")
    name = Path(value).name
    check_relative(run_dir, name, what)
    root = Path(run_dir).parent
    candidate = root / name
    if Path(value).is_absolute() and os.path.realpath(Path(value).parent) != os.path.realpath(root):
        raise RunStoreError(f"run {run_dir}: the manifest's {what} {value!r} is not in the same runs directory; refused")
    if candidate.is_symlink() and not _inside(os.path.realpath(candidate), os.path.realpath(root)):
        raise RunStoreError(f"run {run_dir}: the {what} {name} is a symbolic link pointing outside the runs directory; refused")
    return candidate


# --- array files ----------------------------------------------------------------------------------------------


def _header(handle: Any, size: int, where: str, error: type[QconsistError] = RunStoreError) -> tuple[np.dtype, tuple[int, ...], int]:
    """dtype, shape and data offset of a ``.npy`` stream of ``size`` bytes; refuses lies and objects."""
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle, max_header_size=1 << 16)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle, max_header_size=1 << 16)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise error(f"{where} is not a valid .npy array ({' '.join(str(exc).split())[:120]})") from None
    if dtype.hasobject:
        raise error(f"{where} holds Python objects; refused (qconsist never unpickles)")
    offset = handle.tell()
    count = 1
    for dim in shape:
        count *= int(dim)
    expected = offset + count * dtype.itemsize
    if expected != size:
        raise error(f"{where}: its header says {tuple(shape)} {dtype} ({expected} bytes with the header), "
                    f"the file holds {size}; refused")
    return dtype, tuple(int(d) for d in shape), offset


def check_npy(path: Path, where: str, dtype: np.dtype | None = None, ndim: int | None = None) -> tuple[int, ...]:
    """The shape of the ``.npy`` at ``path`` once its header is shown to fit the file (and ``dtype``)."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as handle:
            found, shape, _ = _header(handle, size, where)
    except OSError as exc:
        raise RunStoreError(f"cannot read {where}: {exc.strerror or exc}") from None
    if dtype is not None and found != dtype:
        raise RunStoreError(f"{where}: dtype {found} is not the expected {dtype}; refused")
    if ndim is not None and len(shape) != ndim:
        raise RunStoreError(f"{where}: {len(shape)} dimensions, expected {ndim}; refused")
    return shape


def check_npz(path: Path, where: str, error: type[QconsistError] = RunStoreError,
              budget: int | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every member of the ``.npz`` at ``path``, checked as ``check_npy`` checks a file, before anything is
    decompressed but each member's ``.npy`` header: name -> (dtype, shape). Refused in one line (``error``): a
    file that is not a zip archive (a text file named ``.npz``), a truncated one, a member that is not a
    ``.npy`` array, a member claiming more than ``QCONSIST_MAX_FILE_BYTES``, members that decompress to more
    than ``budget`` bytes in all (a deflate bomb), a header that lies about the member's size (never read
    past it), object arrays (never unpickled)."""
    members: dict[str, tuple[str, tuple[int, ...]]] = {}
    limit = max_file_bytes()
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            for info in infos:
                if not info.filename.endswith(".npy") or info.is_dir():
                    raise error(f"{where}: member {shorten(info.filename)!r} is not an array (.npy); refused")
                if info.file_size > limit:
                    raise error(f"{where}: member {shorten(info.filename)!r} claims {info.file_size} bytes, more than the "
                                f"limit of {limit} (QCONSIST_MAX_FILE_BYTES); refused")
            total = sum(info.file_size for info in infos)
            if budget is not None and total > budget:
                raise error(f"{where}: its members decompress to {total} bytes, more than the {budget} this reader "
                            f"holds in memory (a {os.stat(path).st_size}-byte archive); refused")
            for info in infos:
                with archive.open(info) as handle:
                    dtype, shape, _ = _header(handle, info.file_size, f"{where} member {shorten(info.filename)}", error)
                members[info.filename[:-4]] = (dtype.str, shape)
    except QconsistError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise error(f"{where} is not a valid .npz archive ({' '.join(str(exc).split())[:120]})") from None
    return members


def load_npz(path: Path, where: str, keys: list[str] | None = None, error: type[QconsistError] = RunStoreError,
             budget: int | None = None) -> dict[str, np.ndarray]:
    """The arrays ``keys`` (default all) of a checked ``.npz`` (``check_npz``); a missing key or a bad member is
    one line."""
    members = check_npz(path, where, error, budget)
    wanted = list(members) if keys is None else keys
    missing = [k for k in wanted if k not in members]
    if missing:
        raise error(f"{where} has no array {missing[0]!r}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in wanted}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise error(f"cannot read {where}: {' '.join(str(exc).split())[:160]}") from None


def memory_bytes() -> int:
    """This machine's physical memory: what a reader that holds a file's arrays in memory may take at most."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return MAX_FILE_BYTES
