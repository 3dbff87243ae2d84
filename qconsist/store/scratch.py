"""Scratch folders: temporary files live inside the run directory being written, and go away.

While a ``RunDirectory`` is open (``with RunDirectory.create(...)``), ``scratch_dir`` makes its folders under
``<run>/.scratch/``; the run removes ``.scratch`` when it finishes or is abandoned, so nothing is left on
success or failure, and a killed run's leftovers stay inside its own (incomplete) directory, never in the
system's temporary folder. Without an open run (``calib repeat`` of a model, ``explain``) the folder is made in
the system's temporary folder and removed on success, failure and, through the CLI's SIGTERM handler, signals.

A write into a scratch folder that fails for want of space (the tools that write there, onnx and onnxruntime's
quantizer, raise a bare ``OSError``, often without the file's name) is an ``OutputError`` naming the folder.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

from qconsist.errors import OutputError

SCRATCH_NAME = ".scratch"
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # a write failed for want of space

_ROOT: ContextVar[Path | None] = ContextVar("qconsist_scratch_root", default=None)
LIVE: set[str] = set()  # every scratch folder and root this process has open: what an emergency exit removes


def remove_live() -> None:
    """Remove every scratch folder still open (``qconsist.cli.app``: a SIGTERM that the main thread, busy in
    onnxruntime, does not take up in time ends the process at once, without its ``finally`` blocks)."""
    for folder in sorted(LIVE, key=len, reverse=True):
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def scratch_root(run_path: Path) -> Iterator[Path]:
    """Make ``run_path/.scratch`` the home of every scratch folder until the block ends, then remove it. It is
    also the process's temporary folder meanwhile (``tempfile.tempdir``): the folders onnxruntime's own tools make
    there (``pre.quant.*``, ``ort.quant.*``) then live in the run too, and a killed run leaves them inside it."""
    root = Path(run_path) / SCRATCH_NAME
    token = _ROOT.set(root)
    saved = tempfile.tempdir
    try:
        root.mkdir(exist_ok=True)
        LIVE.add(str(root))
        tempfile.tempdir = str(root)
        yield root
    finally:
        tempfile.tempdir = saved
        _ROOT.reset(token)
        shutil.rmtree(root, ignore_errors=True)
        LIVE.discard(str(root))


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh temporary folder (inside the open run directory, if any), removed when the block ends."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=scratch_parent()) as folder:
        LIVE.add(folder)
        try:
            yield Path(folder)
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            where = exc.filename or f"in {folder}"
            raise OutputError(f"cannot write {where}: {exc.strerror or 'no space left'} (the disk holding it is full)") from None
        finally:
            LIVE.discard(folder)


def scratch_parent() -> Path | None:
    """Where a temporary folder managed by its owner goes: the open run's ``.scratch`` (made), or None (the
    system's temporary folder)."""
    root = _ROOT.get()
    if root is not None:
        root.mkdir(exist_ok=True)
    return root
