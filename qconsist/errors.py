"""The one root exception and its kinds.

A ``QconsistError`` is a user error: the CLI prints ``error: <message>`` on one line and exits with the
error's ``exit_code``. Anything else escaping the library is a bug: the CLI prints ``internal error: …`` on
one line and exits 4 (the traceback with ``-v``).

A message names the parameters it is about in backticks (```count` must be >= 1``): the library's text
shows the bare name (``count must be >= 1``), and the CLI shows the flag of the command that took it
(``--count must be >= 1``); parameters are named, never flags.

Exit codes (documented in docs/trust.md, "Exit codes"):

* 0 success / identical / pass
* 1 a negative verdict (runs diverged, calibrations disagree, gate failed)
* 2 an error: bad input, unsupported model, unwritable output, incomplete or incompatible run
* 3 the machine cannot do this (no GPU / no CUDA execution provider)
* 4 an internal error: a bug in qconsist (never the code of a failed gate)
* 130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import re
from typing import Callable

EXIT_OK = 0
EXIT_DIVERGED = 1
EXIT_ERROR = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130

_PARAMETER = re.compile(r"`([a-z][a-z0-9_]*)`")


class QconsistError(Exception):
    """Root of every error a user can cause and fix."""

    exit_code = EXIT_ERROR
    kind = "error"

    def __init__(self, message: str) -> None:
        self.template = message
        self.message = _PARAMETER.sub(r"\1", message)
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    @property
    def parameters(self) -> tuple[str, ...]:
        """The parameters the message names."""
        return tuple(_PARAMETER.findall(self.template))

    def render(self, name: Callable[[str], str]) -> str:
        """The message with each named parameter spelled as ``name(parameter)`` (a CLI flag, say)."""
        return _PARAMETER.sub(lambda m: name(m.group(1)), self.template)


class InputError(QconsistError):
    """A file the user gave is missing, unreadable or malformed (model, image, array, config)."""

    kind = "input"


class ConfigError(InputError):
    """A pipeline, policy or option value is invalid (unknown key, wrong type, out of range)."""

    kind = "config"


class UnsupportedModelError(QconsistError):
    """The model uses something qconsist cannot handle faithfully (a Caffe layer, an opset)."""

    kind = "unsupported"


class ShapeMismatchError(InputError):
    """Input data does not fit the model's declared input."""

    kind = "shape"


class OutputError(QconsistError):
    """An output location cannot be written."""

    kind = "output"


class RunStoreError(QconsistError):
    """A run directory is missing, incomplete, of an unknown schema, or not comparable."""

    kind = "run"


class FidelityError(QconsistError):
    """A stage's output failed its numerical check against an independent reference."""

    kind = "fidelity"


class UnavailableError(QconsistError):
    """This machine cannot do what was asked (no GPU, no CUDA execution provider)."""

    kind = "unavailable"
    exit_code = EXIT_UNAVAILABLE
