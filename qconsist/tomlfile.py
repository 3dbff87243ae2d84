"""Reading the TOML files users write (pipeline, nightly, policy, model descriptions): one clear line for
every way a file can be unusable."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from qconsist.errors import ConfigError, InputError, QconsistError


def read_text(path: Path, what: str, error: type[QconsistError] = InputError) -> str:
    """The file's text, or ``error`` saying why it cannot be read (missing, a directory, not UTF-8...)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text") from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def loads(text: str, source: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error is a ``ConfigError`` naming ``source``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML ({exc})") from None


def read_toml(path: Path, what: str, error: type[QconsistError] = InputError) -> dict[str, Any]:
    return loads(read_text(path, what, error), str(path))
