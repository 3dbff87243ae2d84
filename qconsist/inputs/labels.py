"""Labels: the class index of each sample of an input set, from the dataset itself or a labels file.

One idea wherever labels appear: a ``Labels`` maps sample names to class indices (and, where known, class
indices to class names). It comes from

* a folder tree with one subfolder per class: classes are the subfolder names, sorted (or in the order of a
  ``classes.txt`` beside them), their indices 0, 1, …; a sample's label is its folder's index;
* a labels file — in a flat image folder (``labels.csv``, ``labels.json`` or ``labels.txt`` beside the
  images), or named by the nightly's ``labels`` key — in one of three forms:

  - ``.json``: an object ``{"sample name": label}`` (the nightly's ``labels.json``);
  - ``.csv``: rows ``file,label``, with an optional header row whose first cell is ``file``, ``filename``,
    ``name``, ``image``, ``path`` or ``sample``;
  - anything else: text lines ``file label`` (the label is the line's last word, so a file name may hold
    spaces; blank lines and lines starting with ``#`` are skipped).

  A label is a class index (an integer >= 0) or a class name, numbered by ``classes.txt`` when the folder has
  one, else by sorting the names used.

Sample names are what the input set calls its samples: file names in a flat folder, ``class/file`` paths in a
class-folder tree.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from qconsist.errors import ConfigError, InputError
from qconsist.store.serde import loads

LABEL_FILES = ("labels.csv", "labels.json", "labels.txt")
CLASSES_FILE = "classes.txt"
_HEADER = {"file", "filename", "name", "image", "path", "sample"}


@dataclass(frozen=True)
class Labels:
    """Class indices by sample name; ``classes``: class names by index, where known; ``source``: where they
    came from (``folders`` or the labels file's path)."""

    by_name: Mapping[str, int]
    classes: tuple[str, ...] = ()
    source: str = ""
    _unused: int = field(default=0, compare=False)

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> int | None:
        return self.by_name.get(name)

    def of(self, names: Iterable[str]) -> list[int | None]:
        """The label of each of ``names`` (``None`` where a sample has none)."""
        return [self.by_name.get(n) for n in names]

    def summary(self, names: Sequence[str]) -> dict[str, Any]:
        """What a manifest records about the labels of the samples ``names`` (the labels themselves go in the
        run's sample table)."""
        labelled = sum(1 for n in names if n in self.by_name)
        found = {self.by_name[n] for n in names if n in self.by_name}
        return {"source": self.source, "labelled": labelled, "classes": len(self.classes) or len(found)}


def read_classes(path: Path) -> tuple[str, ...]:
    """Class names by index, one per line of ``classes.txt`` (blank lines and ``#`` comments skipped)."""
    lines = _lines(path, "classes file")
    names = tuple(text for _, text in lines)
    seen: dict[str, int] = {}
    for number, text in lines:
        if text in seen:
            raise ConfigError(f"{path}:{number}: class {text!r} is listed twice (first on line {seen[text]})")
        seen[text] = number
    if not names:
        raise ConfigError(f"{path} lists no classes")
    return names


def read_labels(path: Path, classes: Sequence[str] = ()) -> Labels:
    """The labels file ``path`` (forms in the module docstring); ``classes`` numbers labels given as names."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        pairs = _json_pairs(path)
    elif path.suffix.lower() == ".csv":
        pairs = _csv_pairs(path)
    else:
        pairs = _text_pairs(path)
    return _numbered(path, pairs, tuple(classes))


def _read(path: Path, what: str = "labels file") -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {' '.join(str(exc).split())}") from None


def _lines(path: Path, what: str = "labels file") -> list[tuple[int, str]]:
    return [(number, line.strip()) for number, line in enumerate(_read(path, what).splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]


def _json_pairs(path: Path) -> list[tuple[str, str, Any]]:
    try:
        data = loads(_read(path))
    except ValueError as exc:
        raise ConfigError(f"labels file {path} is not a JSON object of sample name -> class ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"labels file {path} must map sample names to classes (a JSON object)")
    return [(f"{path}: sample {name!r}", name, value) for name, value in data.items()]


def _csv_pairs(path: Path) -> list[tuple[str, str, Any]]:
    rows = [(number, row) for number, row in enumerate(csv.reader(io.StringIO(_read(path))), 1)
            if row and any(cell.strip() for cell in row)]
    if rows and rows[0][1][0].strip().lower() in _HEADER:
        rows = rows[1:]
    pairs = []
    for number, row in rows:
        if len(row) != 2:
            raise ConfigError(f"{path}:{number}: a row must be `file,label`, got {len(row)} cell(s)")
        pairs.append((f"{path}:{number}", row[0].strip(), row[1].strip()))
    return pairs


def _text_pairs(path: Path) -> list[tuple[str, str, Any]]:
    pairs = []
    for number, line in _lines(path):
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            raise ConfigError(f"{path}:{number}: a line must be `file label`, got {line!r}")
        pairs.append((f"{path}:{number}", parts[0], parts[1]))
    return pairs


def _index(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _numbered(path: Path, pairs: list[tuple[str, str, Any]], classes: tuple[str, ...]) -> Labels:
    """Labels from (where, name, label) triples: integers as they are, names through ``classes`` (or sorted)."""
    named = sorted({v for _, _, v in pairs if _index(v) is None and isinstance(v, str)})
    if any(not isinstance(v, (int, str)) or isinstance(v, bool) for _, _, v in pairs):
        where, _, value = next(p for p in pairs if not isinstance(p[2], (int, str)) or isinstance(p[2], bool))
        raise ConfigError(f"{where}: label {value!r} is neither a class index nor a class name")
    if named and len(named) != len({v for _, _, v in pairs}) and not classes:
        raise ConfigError(f"labels file {path} mixes class indices and class names; use one, or list the classes "
                          f"in {CLASSES_FILE}")
    order = classes or tuple(named)
    position = {name: index for index, name in enumerate(order)}
    by_name: dict[str, int] = {}
    for where, name, value in pairs:
        index = _index(value)
        if index is None:
            if value not in position:
                raise ConfigError(f"{where}: class {value!r} is not in {CLASSES_FILE}")
            index = position[value]
        elif index < 0 or (classes and index >= len(classes)):
            raise ConfigError(f"{where}: class index {index} is not one of the {len(classes)} classes of {CLASSES_FILE}"
                              if classes else f"{where}: class index {index} is negative")
        if name in by_name and by_name[name] != index:
            raise ConfigError(f"{where}: sample {name!r} is labelled twice, {by_name[name]} and {index}")
        by_name[name] = index
    return Labels(by_name, order if named or classes else (), str(path))
