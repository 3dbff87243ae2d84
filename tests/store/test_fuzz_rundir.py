"""Fuzzing hostile run directories (hypothesis): edited manifests, truncated and flipped files, swapped files,
symbolic links to bait files outside, files replaced by directories, tracks covered by rehashing the
manifest. Each example runs a reading command on the damaged copy and asserts the contract: exit 0, 1 or 2,
at most one line on stderr, never a traceback, and — checked with a file-access audit hook on ``open``, not
by reading the code — no file outside the runs directory opened (bait files included)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import qconsist
from hostile import rehash
from qconsist.cli import app
from qconsist.store.verify import reset_cache

FUZZ = settings(max_examples=int(os.environ.get("QCONSIST_FUZZ_EXAMPLES", "80")), deadline=None, database=None,
                derandomize=not os.environ.get("QCONSIST_FUZZ_RANDOM"), phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

_OPENED: list[str] = []
_RECORDING = [False]


def _audit(event: str, args: tuple) -> None:
    if _RECORDING[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # hooks cannot be removed: it records only while _RECORDING is set

_PYTHON = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                *sysconfig.get_paths().values(),
                                                os.path.dirname(qconsist.__file__)) if p})  # imports
_SYSTEM = ("/proc/", "/sys/", "/dev/null", "/dev/urandom", "/usr/share/zoneinfo", "/etc/localtime")

HOSTILE_VALUES = st.sampled_from([
    None, "", "../../etc/passwd", "/etc/passwd", "/dev/zero", "../outside/secret.onnx", "quantize/model.onnx",
    "dump/index.json", "outputs/000000.npz", "dump/../dump/index.json", "x" * 300, 0, -1, 10**12, 1.5, True, [],
    {}, {"path": "../outside/passwd"}, ["../outside/passwd"], "qconsist.run/2", "complete", "\x00",
])


def _pointers(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _pointers(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:6]):
            found += _pointers(item, (*prefix, index))
    return found


def _set(data: Any, pointer: tuple, value: Any) -> Any:
    if not pointer:
        return value
    parent = data
    for part in pointer[:-1]:
        parent = parent[part]
    parent[pointer[-1]] = value
    return data


def _files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file() and not p.is_symlink())


def _mutate(runs: Path, outside: Path, mutation: tuple) -> None:
    kind, target, a, b, value, cover = mutation
    run = runs / target
    files = _files(run)
    if kind == "json":
        manifest = run / "manifest.json"
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            return  # already deleted or damaged by an earlier mutation
        pointers = _pointers(data)
        data = _set(data, pointers[a % len(pointers)], value)
        manifest.write_text(json.dumps(data))
        return
    if not files:
        return
    path = files[a % len(files)]
    relative = path.relative_to(run).as_posix()
    if kind == "truncate":
        blob = path.read_bytes()
        path.write_bytes(blob[: b % (len(blob) + 1)])
    elif kind == "flip":
        blob = bytearray(path.read_bytes())
        if blob:
            blob[b % len(blob)] ^= 0xFF
            path.write_bytes(bytes(blob))
    elif kind == "swap":
        other = files[b % len(files)]
        if other == path:
            other = files[(b + 1) % len(files)]
        if other == path:
            return
        tmp = run / ".swap"
        os.replace(path, tmp)
        os.replace(other, path)
        os.replace(tmp, other)
    elif kind == "symlink":
        bait = [outside / "secret.onnx", outside / "passwd", Path("/dev/zero"), Path("/etc/passwd"),
                runs / "pipeline" / "quantize" / "model.onnx"][b % 5]
        path.unlink()
        path.symlink_to(bait)
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "delete":
        path.unlink()
    if cover and relative != "manifest.json" and path.is_file() and not path.is_symlink():
        try:
            rehash(run, relative)
        except (KeyError, ValueError, TypeError, AttributeError, OSError):
            pass


MUTATION = st.tuples(
    st.sampled_from(["json", "json", "truncate", "flip", "swap", "symlink", "directory", "delete"]),
    st.sampled_from(["pipeline2", "inference2"]),
    st.integers(0, 10_000), st.integers(0, 10_000), HOSTILE_VALUES, st.booleans(),
)
COMMANDS = st.sampled_from(["diff-pipeline", "diff-inference", "diff-tolerance", "verify", "report", "runs-show", "run"])


def _command(name: str, runs: Path, out: Path) -> list[str]:
    return {
        "diff-pipeline": ["diff", str(runs / "pipeline"), str(runs / "pipeline2")],
        "diff-inference": ["diff", str(runs / "inference"), str(runs / "inference2")],
        "diff-tolerance": ["diff", str(runs / "inference"), str(runs / "inference2"), "--atol", "1"],
        "verify": ["verify", str(runs / "pipeline2"), str(runs / "inference2")],
        "report": ["report", str(runs / "inference2"), str(runs / "pipeline2"), "-o", str(out / "report.html")],
        "runs-show": ["runs", "show", str(runs / "inference2")],
        "run": ["run", str(runs / "pipeline2"), "--inputs", str(runs / "arrays.npy"), "--runs-dir", str(out / "runs")],
    }[name]


def _recorded_models(runs: Path) -> set[str]:
    """The models the undamaged inference runs record having run and the manifest of the run they came from
    (absolute paths, outside the copy): the files outside a run that a reader may open, once their size and
    sha256 match the record (store/run.py: ``Run.source``)."""
    found = set()
    for name in ("inference", "inference2"):
        data = json.loads((runs / name / "manifest.json").read_text())
        found.add(os.path.realpath(data["model"]["path"]))
        found.update(os.path.realpath(s["artifact"]["path"]) for s in data["stages"] if isinstance(s.get("artifact"), dict))
        if isinstance(data["model"].get("run"), str):  # the source run's manifest, opened at its recorded size and sha256
            found.add(os.path.realpath(os.path.join(data["model"]["run"], "manifest.json")))
    return found


def _allowed(path: str, runs: Path, out: Path, recorded: set[str]) -> bool:
    real = os.path.realpath(path)
    inside = [os.path.realpath(runs) + os.sep, os.path.realpath(out) + os.sep]
    return (real.startswith((*inside, *_PYTHON, *_SYSTEM)) or real == os.path.realpath(out)  # fsync of the output folder
            or real in recorded)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3), command=COMMANDS)
def test_hostile_run_directories(small_runs, mutations, command):
    folder = Path(tempfile.mkdtemp(prefix="qconsist-fuzz-"))
    try:
        runs, outside, out = folder / "runs", folder / "outside", folder / "out"
        shutil.copytree(small_runs["runs"], runs, symlinks=True)
        shutil.copyfile(small_runs["data"], runs / "arrays.npy")
        outside.mkdir()
        out.mkdir()
        shutil.copyfile(runs / "pipeline" / "quantize" / "model.onnx", outside / "secret.onnx")
        (outside / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        for mutation in mutations:
            _mutate(runs, outside, mutation)
        reset_cache()
        _OPENED.clear()
        _RECORDING[0] = True
        try:
            result = CliRunner().invoke(app, _command(command, runs, out))
        finally:
            _RECORDING[0] = False
        assert result.exit_code in (0, 1, 2), (result.exit_code, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
        assert result.stderr.count("\n") <= 1, result.stderr
        recorded = _recorded_models(small_runs["runs"])
        escaped = sorted({p for p in _OPENED if not _allowed(p, runs, out, recorded)})
        assert not escaped, f"opened outside the runs directory: {escaped}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
