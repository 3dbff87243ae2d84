"""A ``qconsist.progress.Progress`` for tests that remembers every task line: [description, total, advanced]."""

from __future__ import annotations

from contextlib import contextmanager


class Recorder:
    def __init__(self) -> None:
        self.tasks: list[list] = []

    @contextmanager
    def task(self, description, total):
        record = [description, total, 0]
        self.tasks.append(record)

        class Handle:
            def advance(self, amount=1):
                record[2] += amount

        yield Handle()
