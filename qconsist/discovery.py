"""One registry discovery: the modules of a package that declare a known name (a stage's ``STAGE``, an
executor's ``EXECUTOR``), so that a new stage or executor is one new file and nothing else to edit."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def discover(package: str, attribute: str) -> list[tuple[str, Any]]:
    """``(module name, its attribute)`` for every module of ``package`` that defines ``attribute``."""
    found = []
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        value = getattr(module, attribute, None)
        if value is not None:
            found.append((module.__name__, value))
    return found
