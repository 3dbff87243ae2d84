"""The one JSON serializer: results, reports and manifests are written and read through ``dumps``/``loads``.

* Objects become JSON through ``to_jsonable``: anything with ``to_json()`` (every result type), enums (their
  value), paths (strings), numpy scalars and arrays, tuples and sets (lists).
* JSON has no NaN or infinity. A non-finite float is written as ``null`` and named, by its JSON pointer
  (RFC 6901), in a top-level ``"nonfinite"`` object (``{"/max_abs": "inf"}``); ``loads`` puts the values
  back. So every number in the file is a number, a reader that ignores the map sees ``null`` (never a
  fake finite value), and a round trip is exact.
* A result type is declared once with ``@serialized``: its dataclass fields are its JSON form, plus the schema
  it is written under, the derived figures written beside the fields (``passed``, a summary), and the keys of
  older records renamed on reading. ``to_json``/``from_json`` are generated from the declaration
  (``unstructure``/``structure``); a type writes its own only where its JSON form is not its fields.
"""

from __future__ import annotations

import typing
import types
import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from qconsist.limits import DEEP, too_deep

NONFINITE = "nonfinite"
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Form:
    """How a result type is written and read: declared once, by ``@serialized``."""

    schema: str | None = None  # written first as "schema"; a record of another schema is refused
    derived: tuple[str, ...] = ()  # properties or no-argument methods ("part.name" for a part's) written after
    # the fields, ignored on reading
    renames: Mapping[str, str] = dataclasses.field(default_factory=dict)  # key in older records -> field
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # older records -> this form, before reading
    error: type[Exception] = TypeError  # what a refused or malformed record raises
    refused: str = "not a {schema} record (schema {found!r})"  # {schema}, {found}
    malformed: str = "{schema} record is malformed: {exc}"  # {schema}, {exc}


def serialized(cls: type[T] | None = None, **form: Any) -> Any:
    """Declare a dataclass's JSON form (``Form``'s fields as keywords) and give it the generated ``to_json``
    and ``from_json``, unless it defines its own."""

    def declare(kind: type[T]) -> type[T]:
        kind.__serde__ = Form(**form)  # type: ignore[attr-defined]
        if "to_json" not in kind.__dict__:
            kind.to_json = unstructure  # type: ignore[attr-defined]
        if "from_json" not in kind.__dict__:
            kind.from_json = classmethod(_read)  # type: ignore[attr-defined]
        return kind

    return declare(cls) if cls is not None else declare


def unstructure(value: Any) -> dict[str, Any]:
    """The JSON data of a dataclass: its schema (when declared), its fields, then its derived figures."""
    form: Form = getattr(value, "__serde__", None) or Form()
    data: dict[str, Any] = {"schema": form.schema} if form.schema else {}
    for f in dataclasses.fields(value):
        data[f.name] = to_jsonable(getattr(value, f.name))
    for path in form.derived:  # "name", or "part.name" for a figure of a part (written as "name")
        figure = value
        for name in path.split("."):
            figure = getattr(figure, name)
        data[path.rsplit(".", 1)[-1]] = to_jsonable(figure() if callable(figure) else figure)
    return data


def _read(cls: type[T], data: Any) -> T:
    form: Form = cls.__serde__  # type: ignore[attr-defined]
    if form.schema is not None and (not isinstance(data, dict) or data.get("schema") != form.schema):
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise form.error(form.refused.format(schema=form.schema, found=found))
    if not isinstance(data, Mapping):
        raise form.error(form.malformed.format(schema=form.schema or cls.__name__,
                                               exc=f"expected an object, got {type(data).__name__}"))
    data = {form.renames.get(k, k): v for k, v in data.items() if form.renames.get(k, k) not in data or k not in form.renames}
    if form.upgrade is not None:
        data = form.upgrade(data)
    if form.schema is None:
        return structure(cls, data)
    try:
        return structure(cls, data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise form.error(form.malformed.format(schema=form.schema, exc=exc)) from None


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (floats may still be non-finite; ``dumps`` handles those)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if hasattr(value, "to_json") and callable(value.to_json):
        return to_jsonable(value.to_json())
    if isinstance(value, Enum):
        return to_jsonable(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [to_jsonable(v) for v in items]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _finite(value: Any, pointer: str, found: dict[str, str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found[pointer] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{pointer}/{_escape(k)}", found) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, f"{pointer}/{i}", found) for i, v in enumerate(value)]
    return value


def encode(value: Any) -> Any:
    """JSON data with non-finite floats replaced by ``null`` and listed under ``"nonfinite"``."""
    found: dict[str, str] = {}
    data = _finite(to_jsonable(value), "", found)
    if found:
        if not isinstance(data, dict):
            raise ValueError("non-finite numbers can only be recorded in a JSON object")
        data = {**data, NONFINITE: found}
    return data


def decode(data: Any) -> Any:
    """The inverse of ``encode``: the non-finite floats put back where ``"nonfinite"`` says."""
    if not isinstance(data, dict) or not isinstance(data.get(NONFINITE), dict):
        return data
    data = dict(data)
    found = data.pop(NONFINITE)
    for pointer, text in found.items():
        parts = [_unescape(p) for p in str(pointer).split("/")[1:]]
        if not parts or text not in ("nan", "inf", "-inf"):
            continue
        parent: Any = data
        try:
            for part in parts[:-1]:
                parent = parent[int(part)] if isinstance(parent, list) else parent[part]
            last = parts[-1]
            if isinstance(parent, list):
                parent[int(last)] = float(text)
            elif isinstance(parent, dict) and last in parent:
                parent[last] = float(text)
        except (KeyError, IndexError, ValueError, TypeError):
            continue  # a map that does not fit the data is ignored, never guessed at
    return data


def dumps(value: Any, indent: int | None = 2) -> str:
    """JSON text that encodes as UTF-8: a path that is not UTF-8 (its bytes kept by Python as surrogate
    escapes, U+DC80..U+DCFF) is written as the JSON escape ``\\udcXX``, which ``loads`` reads back to the same path."""
    text = json.dumps(encode(value), indent=indent, allow_nan=False, ensure_ascii=False) + "\n"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates occur only inside JSON strings, where \udcXX is their escape
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def loads(text: str | bytes) -> Any:
    """JSON read from an untrusted file: lists and objects nested at most ``MAX_DEPTH`` deep (deeper is a
    ``ValueError``, never a ``RecursionError`` in the parser or in any reader after it)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(DEEP) from None
    problem = too_deep(data)
    if problem is not None:
        raise ValueError(problem)
    return decode(data)


def to_number(value: Any) -> float:
    """A number read from JSON: a float, ``null`` (not a number: NaN), or the strings ``"inf"``/``"nan"``
    that files written before the ``nonfinite`` map used."""
    if value is None:
        return math.nan
    return float(value)


def structure(cls: Any, data: Any) -> Any:
    """An instance of the dataclass ``cls`` from JSON data, every field converted to its annotated type
    (nested dataclasses, enums, paths, lists, tuples, dicts, optionals). Keys that are not fields (derived
    figures such as ``passed``) are ignored; a missing field takes its default."""
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.init and f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
        elif f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise KeyError(f.name)
    return cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(kind: Any, value: Any) -> Any:
    if value is None:  # a float field written as null (not a number) is NaN; anything else null stays None
        return math.nan if kind is float else None
    if kind is Any:
        return value
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return _convert(option, value)
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
        raise TypeError(f"{value!r} is none of {', '.join(getattr(a, '__name__', str(a)) for a in options)}")
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        from_json = getattr(kind, "from_json", None)
        return from_json(value) if from_json is not None else structure(kind, value)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    if kind is float:
        return to_number(value)
    if kind is Path:
        return Path(value)
    if origin is list:
        return [_convert(args[0], v) for v in value] if args else list(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value)) if args else tuple(value)
    if origin is dict:
        if not args:
            return dict(value)
        return {(int(k) if args[0] is int else k): _convert(args[1], v) for k, v in value.items()}
    if kind in (int, str, bool):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"expected {kind.__name__}, got {value!r}")
        return value
    return value
