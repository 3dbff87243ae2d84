"""Reading the TOML files users write (pipeline, nightly, policy, model descriptions): one clear line for
every way a file can be unusable, and ``Table``: typed access to a table, every unknown key an error."""

from __future__ import annotations

import os
import tomllib
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from qconsist.errors import ConfigError, InputError, QconsistError
from qconsist.limits import DEEP, NAME_MAX, long_component, read_bounded, shorten, too_deep


def read_text(path: Path, what: str, error: type[QconsistError] = InputError) -> str:
    """The file's text (at most ``MAX_TEXT_BYTES``: ``/dev/zero`` is refused, not read until memory runs out), or
    ``error`` saying why it cannot be read (missing, a directory, too large, not UTF-8...)."""
    long = long_component(path)
    if long is not None:
        raise error(f"{what} {shorten(str(path))}: the name {shorten(long, 40)!r} is {len(os.fsencode(long))} bytes long; "
                    f"a file name has at most {NAME_MAX}")
    try:
        return read_bounded(Path(path)).decode("utf-8")
    except ValueError as exc:
        if isinstance(exc, UnicodeDecodeError):
            raise error(f"{what} {path} is not UTF-8 text") from None
        raise error(f"{what} {path}: {exc}") from None
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
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid TOML ({DEEP})") from None
    if too_deep(data) is not None:
        raise ConfigError(f"{source}: invalid TOML ({DEEP})")
    return data


def read_toml(path: Path, what: str, error: type[QconsistError] = InputError) -> dict[str, Any]:
    return loads(read_text(path, what, error), str(path))


class Table:
    """A TOML table being read: typed access by key, and a check that nothing unknown is left."""

    def __init__(self, data: Any, where: str, origin: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{origin}: [{where}] must be a table")
        self.data = dict(data)
        self.where = where
        self.origin = origin
        self.seen: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.origin}: {self.path(key)} {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        self.seen.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(key, f"must be {kind_name(kinds)}, got {value!r}")
        if not isinstance(value, kinds):
            raise self.error(key, f"must be {kind_name(kinds)}, got {value!r}")
        return value

    def choice(self, key: str, enum: type[Enum], default: Any = None) -> Any:
        value = self.get(key, str)
        if value is None:
            return default
        for member in enum:  # type: ignore[attr-defined]
            if member.value.lower() == value.lower():
                return member
        raise self.error(key, f"must be one of {', '.join(m.value for m in enum)}, got {value!r}")  # type: ignore[attr-defined]

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.get(key, list, [])
        if not all(isinstance(v, str) for v in value):
            raise self.error(key, "must be a list of strings")
        return tuple(value)

    def sub(self, key: str) -> "Table | None":
        self.seen.add(key)
        if key not in self.data:
            return None
        return Table(self.data[key], self.path(key), self.origin)

    def finish(self, known_extra: tuple[str, ...] = ()) -> None:
        unknown = sorted(set(self.data) - self.seen - set(known_extra))
        if unknown:
            known = ", ".join(sorted(self.seen | set(known_extra)))
            raise ConfigError(f"{self.origin}: unknown key '{self.path(unknown[0])}' (known in [{self.where or 'top level'}]: {known})")


def kind_name(kinds: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def guard(table: Table, build: Callable[[], Any]) -> Any:
    """``build()``, its ``ConfigError`` prefixed with the file the table comes from."""
    try:
        return build()
    except ConfigError as exc:
        if exc.message.startswith(f"{table.origin}: "):
            raise
        raise ConfigError(f"{table.origin}: {exc.message}") from None
