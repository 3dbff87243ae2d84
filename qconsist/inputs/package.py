"""``package:<distribution-module>/<path>``: a file shipped inside an installed Python package.

Accepted wherever qconsist reads a file: command-line paths (``qconsist/cli/options.py``), pipeline and nightly
files, input sets; e.g. ``package:skimage/data/astronaut.png``. ``resolve_path`` is the one resolver. The package
is located without importing it (its import may pull in heavy dependencies); the file must exist, so nothing is
ever downloaded at run time. (Models shipped in packages that qconsist does not install, such as NudeNet's,
are bundled model descriptions instead: ``models/nudenet_320n.toml``.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from qconsist.errors import ConfigError, InputError

PREFIX = "package:"


def is_package_path(text: str) -> bool:
    return text.startswith(PREFIX) and "/" in text[len(PREFIX):]


def resolve_package_path(text: str) -> Path:
    """The file ``package:<module>/<relative path>`` names, or an ``InputError`` saying what is missing."""
    if not text.startswith(PREFIX):
        raise ConfigError(f"{text!r} is not a package path; write package:<module>/<file>")
    module, _, relative = text[len(PREFIX):].partition("/")
    if not module or not relative or not module.replace("_", "a").isalnum():
        raise ConfigError(f"{text!r}: write package:<module>/<file inside it>, e.g. package:skimage/data/astronaut.png")
    if any(part == ".." for part in Path(relative).parts) or Path(relative).is_absolute():
        raise ConfigError(f"{text!r}: the file must lie inside the package")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"{text}: package '{module}' is not installed; install it (pip install {module})")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / relative
        if path.is_file():
            return path
    raise InputError(f"{text}: package '{module}' has no file {relative}")


def resolve_path(text: str | Path) -> Path:
    """A path as given, or the file a ``package:`` path names."""
    text = str(text)
    return resolve_package_path(text) if text.startswith(PREFIX) else Path(text)
