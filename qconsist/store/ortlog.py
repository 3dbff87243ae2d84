"""onnxruntime's own log lines, kept in the run directory instead of the terminal.

onnxruntime's C++ logger writes straight to the process's standard error (file descriptor 2): the warnings of
the sessions its quantizer and shape tools open with their own options, of the CUDA execution provider, of the
graph optimizer ("Removing initializer …"). No Python option reaches those sessions, so they interleave with
progress bars and fill CI logs. ``capture_ort_log`` points descriptor 2 at the run's log file while the work
runs (child processes started meanwhile inherit it too) and keeps Python's own stderr — logging, progress bars,
messages — on the terminal; afterwards ``OrtLog`` counts what was written, by severity, for a one-line summary
(``OrtLog.summary``) and the manifest. Captures nest: an inner one writes its own file.

``capture_ort_log(None)`` captures into an anonymous file (unlinked at once: nothing is left anywhere, even when
the process is killed) for work without a run directory; ``OrtLog.text`` then holds what was written.
``capturing()`` says whether descriptor 2 is being captured now (``qconsist.inference.session`` makes every
onnxruntime session and every call into one run under a capture).
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, TextIO

LOG_NAME = "onnxruntime.log"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r"\[([VIWEF]):onnxruntime:[^\]]*\]\s*(.*)")
_SEVERITY = {"V": "verbose", "I": "info", "W": "warning", "E": "error", "F": "fatal"}
_terminal: TextIO | None = None  # the real stderr while a capture runs (set by the outermost one)


@dataclass
class OrtLog:
    """What was written to descriptor 2 during a capture: its file (relative to the run directory), the line
    count, onnxruntime's lines by severity, and the first warning or error."""

    path: str
    lines: int = 0
    warnings: int = 0
    errors: int = 0  # error and fatal
    first: str | None = None
    _file: str = ""
    text: str = ""  # what was written, for an anonymous capture (a file's lines stay in the file)

    def summary(self) -> str | None:
        """One line for the terminal, ``None`` when nothing was written."""
        if not self.lines:
            return None
        counts = f"{self.warnings} warning(s), {self.errors} error(s)" if self.warnings or self.errors else f"{self.lines} line(s)"
        first = f"; first: {self.first}" if self.first else ""
        where = f" to {self.path}" if self.path else ""
        return f"onnxruntime logged {counts}{where}{first}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "lines": self.lines, "warnings": self.warnings, "errors": self.errors, "first": self.first}

    def refresh(self) -> bool:
        """Count what the file holds so far (during a capture, for the manifest); whether it holds anything."""
        self.read(Path(self._file)) if self._file else None
        return bool(self.lines)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "OrtLog":
        return cls(str(data["path"]), int(data["lines"]), int(data["warnings"]), int(data["errors"]), data.get("first"))

    def read(self, path: Path) -> None:
        self._file = str(path)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        self.count(text)

    def count(self, text: str) -> None:
        """Count ``text`` (what descriptor 2 received) by severity."""
        self.lines, self.warnings, self.errors, self.first = 0, 0, 0, None
        for raw in text.splitlines():
            line = _ANSI.sub("", raw).strip()
            if not line:
                continue
            self.lines += 1
            match = _LINE.search(line)
            severity = _SEVERITY.get(match.group(1)) if match else None
            if severity == "warning":
                self.warnings += 1
            elif severity in ("error", "fatal"):
                self.errors += 1
            if self.first is None and severity in ("warning", "error", "fatal"):
                self.first = match.group(2)[:200]  # type: ignore[union-attr]


def _is_descriptor_2(stream: Any) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, io.UnsupportedOperation, ValueError, OSError):
        return False


def _anonymous_file() -> int:
    """A descriptor of a file with no name (memory-backed where the system has ``memfd_create``; else a temporary
    file unlinked at once): nothing to clean up, nothing left behind by a killed process."""
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create("qconsist-onnxruntime-log", getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            pass
    with tempfile.TemporaryFile() as anonymous:
        return os.dup(anonymous.fileno())


def capturing() -> bool:
    """Whether descriptor 2 is being captured now (by any ``capture_ort_log``)."""
    return _terminal is not None


@contextmanager
def capture_ort_log(path: Path | None, shown: str | None = None) -> Iterator[OrtLog]:
    """Descriptor 2 into ``path`` (appended; removed again when nothing was written) while the block runs;
    Python's stderr stays on the terminal. ``shown``: the path as the summary names it (default ``path``).
    ``path`` None: into an anonymous file, whose text the record keeps (``OrtLog.text``)."""
    global _terminal
    record = OrtLog(shown or (str(path) if path is not None else ""), _file=str(path) if path is not None else "")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if path is None:
        target = _anonymous_file()
    else:
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    saved = os.dup(2)
    outermost = _terminal is None
    python_stderr = sys.stderr
    swapped: list[logging.StreamHandler] = []
    if outermost:
        _terminal = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    try:
        os.dup2(target, 2)
        if _is_descriptor_2(python_stderr):  # the real stderr (not a test runner's buffer): keep it on the terminal
            sys.stderr = _terminal
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is python_stderr:
                    handler.setStream(_terminal)
                    swapped.append(handler)
        yield record
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        sys.stderr = python_stderr
        for handler in swapped:
            handler.setStream(python_stderr)
        if outermost and _terminal is not None:
            _terminal.close()
            _terminal = None
        if path is None:
            os.lseek(target, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(target, 1 << 16):
                chunks.append(chunk)
            os.close(target)
            record.text = b"".join(chunks).decode("utf-8", errors="replace")
            record.count(record.text)
        else:
            os.close(target)
            record.read(Path(path))
            if not record.lines:
                Path(path).unlink(missing_ok=True)
