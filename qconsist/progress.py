"""Progress reporting for long work. The library reports; the CLI decides whether and how to show it.

Library code takes an optional ``Progress`` and calls ``task(description, total)`` to get a handle with
``advance(n)``; the default does nothing, so the library never prints.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol


class TaskHandle(Protocol):
    def advance(self, amount: int = 1) -> None: ...


class Progress(Protocol):
    def task(self, description: str, total: int | None) -> "contextmanager[TaskHandle]": ...


class _NullHandle:
    def advance(self, amount: int = 1) -> None:
        return None


class NullProgress:
    """Reports nothing."""

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[TaskHandle]:
        yield _NullHandle()


NULL_PROGRESS = NullProgress()
