"""Two packages are also calls of the top level: ``qconsist.diff(run_a, run_b)`` and ``qconsist.gate(run, baseline)``
(``qconsist.api``), as the commands are named, while ``qconsist.diff.diff_runs`` and ``qconsist.gate.evaluate_gate``
stay where they are. A package cannot be both a module and a function under one name, unless the module is
callable: ``callable_package`` gives the package the class below, whose call is the top-level function of the same
name, looked up when called (``qconsist.api`` sits above every package)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class CallablePackage(types.ModuleType):
    """A package whose call is ``qconsist.api.<its name>``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        api = importlib.import_module("qconsist.api")
        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


def callable_package(name: str) -> None:
    """Make the package ``name`` (``qconsist.diff``) callable as the top-level function of its name."""
    sys.modules[name].__class__ = CallablePackage
