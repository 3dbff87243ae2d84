"""Runs under another instruction set: a child process under QEMU user mode (``qemu-x86_64 -cpu MODEL``).

QEMU user mode translates one Linux process's x86-64 code for another x86-64 processor model: the child's
``cpuid`` answers as the model does (Haswell: AVX2 and FMA3, no VNNI, no AVX-512; Nehalem: SSE4.2, no AVX), so
onnxruntime's MLAS chooses that processor's kernels, and the same Python, onnxruntime and model compute what
that processor computes. Only the instruction set is emulated: the host's memory, files and kernel are the
child's. QEMU's TCG implements no AVX-512, so a model of a processor with AVX-512 runs without it.

``qemu_models()`` lists the models (``qemu-x86_64 -cpu help``); ``resolve_model`` checks a name against it
(case-insensitive; ``QemuModelError``, exit 2, lists the valid ones; ``parse_models`` a list, ``parse_model`` one); ``require_qemu`` raises
``QemuMissingError`` (exit 3) naming the package to install. ``emulated_command`` is the command line of a
child under a model, with the environment that makes its fingerprint record the emulated model
(``qconsist.cpu.EMULATED_ENV``); ``run_emulated`` runs one, passing its output through without QEMU's
warnings about host features TCG does not implement.

``call_on(isa, function, request)`` is the one way a part of qconsist does a piece of work under another
instruction set (``calib repeat --isa``'s calibrations, ``locate --ep cpu``'s cells, the gate's outputs under
each processor): ``native`` calls ``function`` here; an emulated model calls it in a child,
``python -m qconsist.emulation MODULE:FUNCTION`` under QEMU (this module's ``main``, the one worker), which
reads the request (JSON) on its stdin and writes the function's result (JSON) as the last line of its stdout.
The caller passes the function, so this module imports nothing above it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import IO, Any, Callable, Sequence

from qconsist.cpu import EMULATED_ENV, QEMU_VERSION_ENV
from qconsist.errors import EXIT_ERROR, EXIT_INTERNAL, EXIT_UNAVAILABLE, ConfigError, QconsistError, UnavailableError

QEMU = "qemu-x86_64"
PACKAGE = "qemu-user"
NATIVE = "native"
# ``locate --ep cpu``'s default set: this processor, AVX2 without VNNI, SSE4.2 without AVX
DEFAULT_MATRIX = (NATIVE, "Haswell", "Nehalem")
# QEMU's warnings about features of the model that TCG does not implement (pcid, x2apic, hle, rtm…)
_TCG_WARNING = re.compile(r"^qemu-x86_64: warning: TCG doesn't support requested feature")


class QemuMissingError(UnavailableError):
    """QEMU user mode is not installed: exit 3 (the environment lacks it), with what to install."""


class QemuModelError(ConfigError):
    """A CPU model QEMU does not know: exit 2, with the valid ones."""


class EmulatedChildError(QconsistError):
    """The work failed in the emulated child: its last line, and its exit code (2, 3 or 4; else 2)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code if exit_code in (EXIT_ERROR, EXIT_UNAVAILABLE, EXIT_INTERNAL) else EXIT_ERROR


def qemu_path() -> str | None:
    return shutil.which(QEMU)


def require_qemu() -> str:
    found = qemu_path()
    if found is None:
        raise QemuMissingError(f"--isa runs the model under QEMU user mode, and {QEMU} is not installed: "
                               f"install the {PACKAGE} package (apt-get install {PACKAGE}; `make qemu` does it)")
    return found


@lru_cache(maxsize=1)
def qemu_version() -> str:
    out = subprocess.run([require_qemu(), "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"version (\S+)", out)
    return match.group(1) if match else out.strip().splitlines()[0] if out.strip() else "unknown"


@lru_cache(maxsize=1)
def qemu_models() -> tuple[str, ...]:
    """The x86 CPU models ``qemu-x86_64 -cpu help`` lists, in its order."""
    out = subprocess.run([require_qemu(), "-cpu", "help"], capture_output=True, text=True, timeout=30).stdout
    models = [line.split()[1] for line in out.splitlines() if line.startswith("x86 ") and len(line.split()) > 1]
    return tuple(models)


def resolve_model(name: str) -> str:
    """``native`` or QEMU's spelling of a CPU model given in any case (``haswell`` → ``Haswell``)."""
    wanted = name.strip()
    if wanted.lower() == NATIVE:
        return NATIVE
    models = qemu_models()
    found = {model.lower(): model for model in models}.get(wanted.lower())
    if found is None:
        raise QemuModelError(f"--isa {name!r} is not a CPU model QEMU knows: use native or one of "
                             f"{', '.join(models)}")
    return found


def parse_models(text: str | Sequence[str]) -> tuple[str, ...]:
    """A comma-separated list (or a sequence) of models, resolved, without repeats, in the order given."""
    items = [part for chunk in ([text] if isinstance(text, str) else text) for part in str(chunk).split(",")]
    names = [item.strip() for item in items if item.strip()]
    if not names:
        raise ConfigError("--isa names no CPU model: give native or QEMU models such as haswell,nehalem")
    if any(name.lower() != NATIVE for name in names):
        require_qemu()
    resolved = [resolve_model(name) for name in names]
    return tuple(dict.fromkeys(resolved))


def parse_model(text: str) -> str:
    """One CPU model (``--isa`` of a command that runs on one instruction set), resolved as ``parse_models`` does."""
    models = parse_models(text)
    if len(models) != 1:
        raise ConfigError(f"`isa` takes one CPU model here, got {', '.join(models)}")
    return models[0]


@lru_cache(maxsize=None)
def unsupported_features(model: str) -> tuple[str, ...]:
    """The features of ``model`` that QEMU's TCG does not implement (pcid, x2apic, hle, rtm…): QEMU warns
    about each whenever it creates a CPU (every thread the child starts), and the child never had them."""
    done = subprocess.run([require_qemu(), "-cpu", model, "/bin/true"], capture_output=True, text=True, timeout=60)
    return tuple(dict.fromkeys(re.findall(r"CPUID\.[0-9A-Fa-f]+H:[A-Z]+\.([A-Za-z0-9_.-]+) \[bit", done.stderr)))


def cpu_argument(model: str) -> str:
    """``-cpu``'s argument: the model without the features TCG lacks (what the child sees either way)."""
    return ",".join([model, *(f"-{feature}" for feature in unsupported_features(model))])


@dataclass(frozen=True)
class EmulatedCommand:
    argv: tuple[str, ...]
    env: dict[str, str]
    model: str


def emulated_command(model: str, argv: Sequence[str], env: dict[str, str] | None = None) -> EmulatedCommand:
    """``argv`` (a Python command: ``sys.executable -m …``) under QEMU emulating ``model`` (resolved), with the
    environment that records the model in the child's fingerprint."""
    qemu = require_qemu()
    child_env = dict(os.environ if env is None else env)
    child_env[EMULATED_ENV] = model
    child_env[QEMU_VERSION_ENV] = qemu_version()
    return EmulatedCommand((qemu, "-cpu", cpu_argument(model), *argv), child_env, model)


def _pass_through(source: IO[str], target: IO[str]) -> None:
    for line in source:
        if not _TCG_WARNING.match(line):
            target.write(line)
            target.flush()


def run_emulated(command: EmulatedCommand, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                 timeout: float | None = None) -> int:
    """Run the child, its output passed through (QEMU's TCG warnings dropped); its exit status."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    with subprocess.Popen(command.argv, env=command.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          bufsize=1) as child:
        threads = [threading.Thread(target=_pass_through, args=(child.stdout, stdout), daemon=True),
                   threading.Thread(target=_pass_through, args=(child.stderr, stderr), daemon=True)]
        for thread in threads:
            thread.start()
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
        for thread in threads:
            thread.join()
    return code


def run_emulated_capture(command: EmulatedCommand, timeout: float | None = None,
                         input: str | None = None) -> subprocess.CompletedProcess:
    """Run the child (``input`` on its stdin) and return its output (QEMU's TCG warnings dropped from stderr)."""
    done = subprocess.run(command.argv, env=command.env, capture_output=True, text=True, timeout=timeout,
                          input=input)
    stderr = "".join(line for line in done.stderr.splitlines(keepends=True) if not _TCG_WARNING.match(line))
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, stderr)


# --- the one worker: a function of qconsist called in a child under QEMU ------------------------------------------

WORKER = "qconsist.emulation"


def _reference(function: Callable[[Any], Any]) -> str:
    """``module:name`` of a module-level function of qconsist (what the child imports)."""
    module, name = getattr(function, "__module__", ""), getattr(function, "__qualname__", "")
    if not module.startswith("qconsist.") or not name or "." in name or "<" in name:
        raise ValueError(f"call_on calls a module-level function of qconsist in the child, not {function!r}")
    return f"{module}:{name}"


def _resolve(reference: str) -> Callable[[Any], Any]:
    module, _, name = reference.partition(":")
    if not module.startswith("qconsist.") or not name:
        raise ConfigError(f"the emulation worker calls a function of qconsist (module:function), not {reference!r}")
    return getattr(importlib.import_module(module), name)


def call_under(model: str, function: Callable[[Any], Any], request: Any, *, what: str,
               timeout: float | None = None) -> tuple[Any, float]:
    """``function(request)`` in a child under QEMU emulating ``model`` (resolved): the request and the result
    cross as JSON (stdin, the last line of stdout). Returns the result and the child's wall time (emulation's
    cost, measured: the child's start-up included). ``what`` names the work in ``EmulatedChildError``'s line."""
    command = emulated_command(model, [sys.executable, "-m", WORKER, _reference(function)])
    started = time.perf_counter()
    done = run_emulated_capture(command, timeout=timeout, input=json.dumps(request))
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EmulatedChildError(f"{what} under emulated {model} failed (exit {done.returncode}): {last}",
                                 done.returncode)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise EmulatedChildError(f"{what} under emulated {model} gave no result", EXIT_INTERNAL)
    return json.loads(lines[-1]), seconds


def call_on(isa: str, function: Callable[[Any], Any], request: Any, *, what: str) -> tuple[Any, float]:
    """``function(request)`` on ``isa``: here for ``native``, else in a child under QEMU (``call_under``);
    the result and the seconds it took (for ``native`` the call's own)."""
    if isa == NATIVE:
        started = time.perf_counter()
        result = function(request)
        return result, time.perf_counter() - started
    return call_under(isa, function, request, what=what)


def main(argv: Sequence[str] | None = None) -> int:
    """The child: ``python -m qconsist.emulation MODULE:FUNCTION`` < request.json > result line."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    try:
        if len(args) != 1:
            raise ConfigError("usage: python -m qconsist.emulation MODULE:FUNCTION < REQUEST.json")
        result = _resolve(args[0])(json.load(sys.stdin))
    except QconsistError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
