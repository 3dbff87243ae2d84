"""Follow `qconsist diff`'s run path: how the two run directories travel between the areas of the code.

    python benchmarks/run_path.py RUN_A RUN_B

Runs ``diff_runs(RUN_A, RUN_B)`` under a profiler hook and records every call that crosses from one area to
another among those a run travels through (``diff``, ``inference``, ``inputs``, ``store``: qconsist's top-level
packages) with the run among its arguments, and how the run is carried:

* ``handle``: a ``Run`` (``qconsist.store.run``: opened and verified once, asked for typed sections and files);
* ``path/manifest``: the run directory's path or its ``Manifest`` — the callee works out file paths from the
  manifest and verifies them again.

Counted by call site (caller function → callee function, each counted once however often it runs): **rooms** are
the modules the run enters, **moves** the call sites that carry it across areas, and **climbs back up** the
moves that carry it as a path or a manifest — each hands the run back down in raw form, so the layer below
starts over (open, verify, read a dict). It works on any version of qconsist (the classes it looks for are
imported if they exist), so the same command measures main before and after a change.

It also counts, over every call made while ``diff_runs`` runs (whatever it carries), the **upward calls**: call
sites where code of a lower layer calls code of a higher one (``tests/test_layers.py``'s ``LAYERS``) — a callback
or an object of the upper layer handed down. Imports never run back up (that test), so these are the only way
the path climbs back up the layers at run time.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import qconsist
from qconsist.diff import diff_runs
from qconsist.store.manifest import Manifest

try:
    from qconsist.store.run import Run
except ImportError:  # qconsist before the Run handle
    Run = None  # type: ignore[assignment,misc]

PACKAGE = Path(qconsist.__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.test_layers import RANK  # noqa: E402  (the one list of layers)
AREAS = ("diff", "inference", "inputs", "store")


def _where(code) -> tuple[str, str] | None:
    """(area, module) of a code object inside qconsist, or None."""
    try:
        relative = Path(code.co_filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    module = ".".join(relative.with_suffix("").parts)
    return relative.parts[0] if len(relative.parts) > 1 else "", module


def _carried(frame, roots: set[str]) -> str | None:
    """How the call's arguments carry a run: ``handle``, ``path/manifest``, or None."""
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    found = None
    for name in names:
        value = frame.f_locals.get(name)
        if Run is not None and isinstance(value, Run):
            found = found or "handle"
        elif isinstance(value, Manifest):
            return "path/manifest"
        elif isinstance(value, (str, Path)) and str(value) and str(Path(value).resolve()) in roots:
            return "path/manifest"
    return found


def trace(run_a: str, run_b: str) -> dict:
    roots = {str(Path(run_a).resolve()), str(Path(run_b).resolve())}
    moves: dict[tuple[str, str, str, str], str] = {}
    rooms: set[str] = set()
    upward: set[tuple[str, str, str, str]] = set()

    def hook(frame, event, arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = _where(frame.f_code), _where(frame.f_back.f_code)
        if callee is not None and caller is not None and RANK[callee[0] or "__init__"] > RANK[caller[0] or "__init__"]:
            upward.add((caller[1], frame.f_back.f_code.co_name, callee[1], frame.f_code.co_name))
        if callee is None or caller is None or callee[0] not in AREAS or caller[0] not in AREAS:
            return
        carried = _carried(frame, roots)
        if carried is None:
            return
        rooms.add(callee[1])
        if callee[0] != caller[0]:
            key = (caller[1], frame.f_back.f_code.co_name, callee[1], frame.f_code.co_name)
            if moves.get(key) != "path/manifest":
                moves[key] = carried

    sys.setprofile(hook)
    try:
        diff_runs(run_a, run_b)
    finally:
        sys.setprofile(None)
    return {"rooms": rooms, "moves": moves, "upward": upward}


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    found = trace(sys.argv[1], sys.argv[2])
    moves = found["moves"]
    climbs = {k: v for k, v in moves.items() if v == "path/manifest"}
    pairs = Counter(f"{k[0].split('.')[0]} -> {k[2].split('.')[0]}" for k in climbs)
    print(f"{len(found['rooms'])} rooms, {len(moves)} moves, {len(climbs)} climbs back up "
          f"({', '.join(f'{p} {n}' for p, n in sorted(pairs.items())) or 'none'})")
    for (caller, caller_fn, callee, callee_fn), carried in sorted(moves.items()):
        print(f"  {caller}.{caller_fn} -> {callee}.{callee_fn}: {carried}")
    print(f"{len(found['upward'])} upward calls (a lower layer calling a higher one)")
    for caller, caller_fn, callee, callee_fn in sorted(found["upward"]):
        print(f"  {caller}.{caller_fn} -> {callee}.{callee_fn}")


if __name__ == "__main__":
    main()
