"""``qconsist upgrade-check --onnxruntime X.Y.Z``: the same model on the same inputs in the locked environment
and in a second one that differs from it in onnxruntime alone, dumped in both, diffed across them.

The second environment is built from ``uv.lock`` (``uv export``: every package at its locked version) with one
pin changed (``uv pip install --overrides``: ``onnxruntime==X.Y.Z``), into a git-ignored folder
(``.qconsist/envs/onnxruntime-X.Y.Z``), with qconsist itself installed editable from this checkout; it is
reused while the lock and the version are the same. The reference run is made in this process, the other
with that environment's ``qconsist run``; the diff puts the version change first, then the first diverging
node and the origin nodes, and ``rewrites`` tells which nodes onnxruntime's optimizer rewrote differently
(the two optimized graphs it saved, compared node by node).

With ``isa`` (a QEMU CPU model, resolved by ``qconsist.emulation.parse_model``) both runs are made under QEMU user
mode emulating that processor, each by its environment's ``qconsist run --isa MODEL`` (the child that every
``--isa`` command starts): both record the emulated instruction set, which the result keeps
(``instruction_set``) with the wall time of each emulated run (a measured figure: emulation is slow).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from packaging.version import InvalidVersion, Version

import qconsist
from qconsist.diff import DiffResult, diff_runs
from qconsist.emulation import NATIVE
from qconsist.errors import ConfigError, InputError, QconsistError, RunStoreError, UnavailableError
from qconsist.explain.graph_changes import GraphRewrites, graph_rewrites, load_graph
from qconsist.inference.model import ModelSource
from qconsist.inference.reader import load_dump
from qconsist.store.run import Run
from qconsist.inference.runner import RunRequest, run_inference
from qconsist.inference.session import ExecutionOptions
from qconsist.inputs import InputSet
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)
SCHEMA = "qconsist.upgrade/1"
PROJECT = Path(qconsist.__file__).resolve().parent.parent
STAMP = ".qconsist-env.json"


@serialized
@dataclass(frozen=True)
class UpgradeEnvironment:
    """A second environment: the lock with onnxruntime at ``onnxruntime``."""

    path: Path
    onnxruntime: str
    lock_sha256: str
    built: bool  # False: an existing one was reused
    seconds: float

    @property
    def qconsist(self) -> Path:
        return self.path / "bin" / "qconsist"


def _version(text: str) -> str:
    try:
        return str(Version(text))
    except InvalidVersion:
        raise ConfigError(f"`onnxruntime` {text!r} is not a version such as 1.32.0") from None


def find_uv() -> Path:
    """The project's pinned uv (``make setup`` installs it into ``.tools/``), else a ``uv`` on PATH."""
    pinned = PROJECT / ".tools" / "bin" / "uv"
    if pinned.is_file():
        return pinned
    found = shutil.which("uv")
    if found is None:
        raise UnavailableError("upgrade-check builds the second environment with uv: run `make setup` (it installs the "
                               "project's pinned uv into .tools/) or put uv on PATH")
    return Path(found)


def _lock() -> Path:
    lock = PROJECT / "uv.lock"
    if not lock.is_file() or not (PROJECT / "pyproject.toml").is_file():
        raise UnavailableError(f"upgrade-check builds the second environment from uv.lock, and {PROJECT} is not a qconsist "
                               "source checkout with one")
    return lock


def _call(command: Sequence[str | Path], what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    log.info("%s: %s", what, " ".join(map(str, command)))
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"{what} failed (exit {done.returncode}): {last}")
    return done.stdout


def upgrade_environment(onnxruntime: str, folder: Path | None = None, extras: Sequence[str] = ("cpu", "caffe", "photos"),
                        ) -> UpgradeEnvironment:
    """The locked environment with ``onnxruntime==<version>`` instead of the locked one, built (or reused)
    in ``folder`` (default ``<checkout>/.qconsist/envs/onnxruntime-<version>``), with ``extras`` (by default
    those of ``make run``: its ``qconsist run`` reads ``package:photos``, its pipeline converts Caffe models)."""
    version = _version(onnxruntime)
    lock = _lock()
    lock_sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    folder = Path(folder) if folder is not None else PROJECT / ".qconsist" / "envs" / f"onnxruntime-{version}"
    stamp = folder / STAMP
    wanted = {"onnxruntime": version, "lock_sha256": lock_sha, "extras": list(extras), "python": sys.version.split()[0]}
    if stamp.is_file() and (folder / "bin" / "qconsist").is_file():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")) == wanted:
                return UpgradeEnvironment(folder, version, lock_sha, False, 0.0)
        except (OSError, ValueError):
            pass
    start = time.perf_counter()
    uv = find_uv()
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": ""}
    env.pop("VIRTUAL_ENV")
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _call([uv, "venv", "--quiet", "--python", sys.executable, folder], "uv venv", env=env)
    requirements, overrides = folder / "requirements.txt", folder / "overrides.txt"
    extra_flags = [flag for name in extras for flag in ("--extra", name)]
    _call([uv, "export", "--frozen", "--no-hashes", "--no-emit-project", "--no-dev", *extra_flags,
           "--format", "requirements-txt", "-o", requirements], "uv export of the lock", cwd=PROJECT, env=env)
    # the one pin changed: the lock's onnxruntime line replaced, and any other package's requirement on it overridden
    lines = requirements.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if not line.strip().lower().startswith("onnxruntime==")]
    if len(kept) == len(lines):
        raise InputError("uv.lock's export has no onnxruntime pin to change")
    requirements.write_text("\n".join([*kept, f"onnxruntime=={version}", ""]), encoding="utf-8")
    # and the lock's own overrides (caffe2onnx's onnx==1.6.0 pin replaced by qconsist's onnx range)
    try:
        locked = tomllib.loads((PROJECT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["uv"].get("override-dependencies", [])
    except (OSError, ValueError, KeyError):
        locked = []
    overrides.write_text("\n".join([f"onnxruntime=={version}", *locked, ""]), encoding="utf-8")
    python = folder / "bin" / "python"
    _call([uv, "pip", "install", "--quiet", "--no-config", "--python", python, "-r", requirements, "--overrides", overrides],
          f"installing the lock with onnxruntime=={version}", env=env)
    _call([uv, "pip", "install", "--quiet", "--no-config", "--python", python, "--no-deps", "-e", PROJECT], "installing qconsist", env=env)
    found = _call([python, "-c", "import onnxruntime; print(onnxruntime.__version__)"], "importing onnxruntime").strip()
    if found != version:
        raise InputError(f"the second environment imports onnxruntime {found}, not {version}")
    stamp.write_text(json.dumps(wanted), encoding="utf-8")
    return UpgradeEnvironment(folder, version, lock_sha, True, time.perf_counter() - start)


@serialized(
    schema=SCHEMA, derived=("passed",), error=RunStoreError,
    refused="upgrade result schema {found!r} is not {schema!r}", malformed="upgrade result is malformed: {exc}",
)
@dataclass
class UpgradeResult:
    """The same model and inputs in this environment (A) and the upgraded one (B). ``passed`` (and truth):
    the dumps are bit-identical."""

    environment: UpgradeEnvironment
    run_a: str
    run_b: str
    diff: DiffResult
    rewrites: GraphRewrites | None = None  # ORT's optimized graph in A -> in B, where they differ
    notes: list[str] = field(default_factory=list)
    isa: str = NATIVE  # the instruction set both runs were made on: native or a QEMU CPU model
    instruction_set: dict = field(default_factory=dict)  # as run A recorded it (``qconsist.cpu.InstructionSet``)
    emulated_seconds: dict[str, float] = field(default_factory=dict)  # "A", "B" -> wall time of the emulated run

    @property
    def passed(self) -> bool:
        return self.diff.passed

    def __bool__(self) -> bool:
        return self.passed


def upgrade_check(
    source: ModelSource,
    inputs: InputSet,
    inputs_args: Sequence[str],
    options: ExecutionOptions,
    environment: UpgradeEnvironment,
    runs_root: Path,
    label: str,
    isa: str = NATIVE,
) -> UpgradeResult:
    """Run ``source`` on ``inputs`` with dumps here (A) and in ``environment`` (B: ``inputs_args`` are the
    ``qconsist run`` flags that select the same inputs there), then diff A and B. ``isa`` (resolved): both runs
    under QEMU emulating that CPU model (see the module docstring)."""
    runs_root = Path(runs_root)
    stamp = int(time.time())
    run_id_a, run_id_b = f"{label}-onnxruntime-here-{stamp}", f"{label}-onnxruntime-{environment.onnxruntime}-{stamp}"
    seconds: dict[str, float] = {}
    if isa == NATIVE:
        run_a = run_inference(source, inputs, RunRequest(options=options, dump=True), runs_root, run_id=run_id_a).run_dir
        faithful_a = True
    else:  # this environment's own ``qconsist run --isa``, as the other environment's below
        run_a, faithful_a, seconds["A"] = _run_in([sys.executable, "-m", "qconsist"], "this environment", source,
                                                  inputs_args, options, runs_root, run_id_a, isa)
    run_b, faithful_b, took = _run_in([environment.qconsist], f"the onnxruntime {environment.onnxruntime} environment",
                                      source, inputs_args, options, runs_root, run_id_b, isa)
    if isa != NATIVE:
        seconds["B"] = took
    opened_a, opened_b = Run.open(run_a), Run.open(run_b)
    recorded = [(run.manifest.environment.get("cpu_isa") or {}) for run in (opened_a, opened_b)]
    if isa != NATIVE:
        for side, cpu in zip("AB", recorded):
            if cpu.get("emulated") != isa:
                raise QconsistError(f"run {side} of upgrade-check was not made under emulated {isa} (it records "
                                    f"{cpu.get('emulated') or 'native'}): its environment's qconsist run ignored --isa")
    diff = diff_runs(opened_a, opened_b)
    result = UpgradeResult(environment, str(run_a), str(run_b), diff, isa=isa, instruction_set=recorded[0],
                           emulated_seconds=seconds)
    dump_a, dump_b = load_dump(opened_a), load_dump(opened_b)
    if dump_a.structure != dump_b.structure:
        result.rewrites = graph_rewrites(load_graph(dump_a.optimized_path, "optimized graph"),
                                         load_graph(dump_b.optimized_path, "optimized graph"),
                                         f"onnxruntime {_here()}", f"onnxruntime {environment.onnxruntime}")
    if not faithful_a:
        result.notes.append("the dump in this environment is NOT faithful")
    if not faithful_b:
        result.notes.append(f"the dump in the onnxruntime {environment.onnxruntime} environment is NOT faithful")
    return result


def _run_in(qconsist_command: Sequence[str | Path], where: str, source: ModelSource, inputs_args: Sequence[str],
            options: ExecutionOptions, runs_root: Path, run_id: str, isa: str) -> tuple[Path, bool, float]:
    """``qconsist run --dump`` of ``source`` by ``qconsist_command`` (an environment's), under ``isa`` unless
    native: its run directory, whether its dump is faithful (exit 0, not 1) and its wall time."""
    model = [str(source.run_dir), "--stage", str(source.stage)] if source.run_dir is not None else [str(source.path)]
    emulated = [] if isa == NATIVE else ["--isa", isa]
    command = [*qconsist_command, "run", *model, *inputs_args, *options.to_args(), *emulated, "--dump", "--json",
               "--runs-dir", runs_root, "--run-id", run_id]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    started = time.perf_counter()
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env)
    took = time.perf_counter() - started
    if done.returncode not in (0, 1):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise QconsistError(f"qconsist run in {where} failed: {last}")
    return Path(json.loads(done.stdout)["run_dir"]), done.returncode == 0, took


def _here() -> str:
    import onnxruntime

    return onnxruntime.__version__
