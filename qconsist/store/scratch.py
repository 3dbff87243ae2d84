"""Scratch folders: temporary files live inside the run directory being written, and go away.

While a ``RunDirectory`` is open (``with RunDirectory.create(...)``), ``scratch_dir`` makes its folders under
``<run>/.scratch/``; the run removes ``.scratch`` when it finishes or is abandoned, so nothing is left on
success or failure, and a killed run's leftovers stay inside its own (incomplete) directory, never in the
system's temporary folder. Without an open run (``calib repeat`` of a model, ``explain``) the folder is made in
the system's temporary folder and removed on success, failure and, through the CLI's SIGTERM handler, signals.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

SCRATCH_NAME = ".scratch"

_ROOT: ContextVar[Path | None] = ContextVar("qconsist_scratch_root", default=None)


@contextmanager
def scratch_root(run_path: Path) -> Iterator[Path]:
    """Make ``run_path/.scratch`` the home of every scratch folder until the block ends, then remove it."""
    root = Path(run_path) / SCRATCH_NAME
    token = _ROOT.set(root)
    try:
        yield root
    finally:
        _ROOT.reset(token)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh temporary folder (inside the open run directory, if any), removed when the block ends."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=scratch_parent()) as folder:
        yield Path(folder)


def scratch_parent() -> Path | None:
    """Where a temporary folder managed by its owner goes: the open run's ``.scratch`` (made), or None (the
    system's temporary folder)."""
    root = _ROOT.get()
    if root is not None:
        root.mkdir(exist_ok=True)
    return root
