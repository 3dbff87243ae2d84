"""A loader that leaves a mark for every sample a process prepares (``stamps``): which samples the input workers
made, and when, seen from the test's process without asking the stream."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qconsist.inputs.loaders import Loader, file_of, prepare


class Stamped(Loader):
    """``base``'s samples, each prepared leaving an empty file ``<index>-<pid>`` in ``folder``."""

    parallel = True

    def __init__(self, base: Any, folder: Path) -> None:
        self.base, self.folder = base, folder

    def prepare(self, index: int):
        (self.folder / f"{index}-{os.getpid()}").touch()
        return prepare(self.base, index)

    def file(self, index: int) -> Path | None:
        return file_of(self.base, index)


def stamps(folder: Path, other_than: int = os.getpid()) -> set[int]:
    """The samples prepared by processes other than ``other_than`` (the input workers, seen from the test)."""
    return {int(p.name.split("-")[0]) for p in folder.iterdir() if int(p.name.split("-")[1]) != other_than}
