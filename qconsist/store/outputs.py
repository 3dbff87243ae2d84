"""Files a command is asked to write beside its result (``report -o``, ``gate --junit``/``--markdown``).

Rules (docs/trust.md, "Hostile input: the rules"): the folder must exist (qconsist makes folders only inside the runs folder); the file
must not be one of the command's inputs, nor a file inside a run directory (a folder holding ``manifest.json``
or ``RUNNING.json``), unless ``force``; it is written atomically, with the umask's permissions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from qconsist.errors import OutputError
from qconsist.store.atomic import write_atomic

RUN_MARKERS = ("manifest.json", "RUNNING.json")


def run_holding(path: Path) -> Path | None:
    """The run directory ``path`` lies in (at any depth), or None."""
    for folder in Path(path).resolve().parents:
        if any((folder / marker).is_file() for marker in RUN_MARKERS):
            return folder
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output(path: Path, inputs: Iterable[Path] = (), force: bool = False) -> Path:
    """``path`` if a command may write it (see the module docstring); an ``OutputError`` saying why not."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"output {path} is a folder; give a file name")
    if not path.parent.is_dir():
        raise OutputError(f"cannot write {path}: folder {path.parent} does not exist (qconsist creates no folder for it)")
    if force:
        return path
    resolved = path.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if resolved == source:
            raise OutputError(f"output {path} would overwrite the input {source}; choose another file (or `force`)")
        if _inside(resolved, source):
            raise OutputError(f"output {path} would write inside the input {source}; choose another file (or `force`)")
    run = run_holding(path)
    if run is not None and path.exists():
        raise OutputError(f"output {path} would overwrite a file of run {run}; choose another file (or `force`)")
    return path


def write_output(path: Path, text: str, inputs: Iterable[Path] = (), force: bool = False) -> Path:
    """Check ``path`` (``check_output``), then write ``text`` to it atomically."""
    path = check_output(path, inputs, force)
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), make_parents=False)
    return path
