"""Bounds on what qconsist reads from untrusted bytes, defined once: how deep lists and tables may nest in a
JSON or TOML file, how large a text file it reads whole may be, and how long a path component may be.

Every reader of a file a user or a run directory hands in goes through these (``qconsist.store.serde.loads``
for JSON, ``qconsist.tomlfile`` for TOML, ``qconsist.store.confine`` for arrays), so a file nested 100,000
lists deep, ``/dev/zero`` given as a pipeline or a 300-byte file name is one line, never a ``RecursionError``,
a ``MemoryError`` or ``ENAMETOOLONG``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MAX_DEPTH = 100  # lists and objects (tables) inside one another: a manifest needs about 8, a result about 12
MAX_TEXT_BYTES = 64 << 20  # a pipeline, policy, nightly or labels file read whole: 64 MiB is far beyond any
NAME_MAX = 255  # bytes in one path component (Linux, macOS)


def nesting(data: Any, limit: int = MAX_DEPTH) -> int:
    """How deep lists, tuples and dicts nest in ``data``, counted iteratively (a hostile file cannot exhaust the
    stack) and up to ``limit + 1``."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, tuple, dict)):
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


DEEP = f"lists and tables nested more than {MAX_DEPTH} levels deep"


def too_deep(data: Any) -> str | None:
    """What to say of ``data`` nested deeper than ``MAX_DEPTH`` (``DEEP``), else None."""
    return DEEP if nesting(data) > MAX_DEPTH else None


def read_bounded(path: Path, limit: int = MAX_TEXT_BYTES) -> bytes:
    """At most ``limit`` bytes of ``path`` (a file, a pipe, a device): ``ValueError`` where it holds more."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"it holds more than {limit} bytes (the limit for a file read whole)")
    return data


def long_component(path: Path | str) -> str | None:
    """The first component of ``path`` longer than ``NAME_MAX`` bytes (which no file system holds), else None."""
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return part
    return None


def shorten(text: str, keep: int = 120) -> str:
    """``text`` as a one-line message shows it: at most ``keep`` characters, the rest said as a count (a 10 MB
    name is not echoed in a 10 MB line)."""
    return text if len(text) <= keep else f"{text[:keep]}… ({len(text)} characters)"
