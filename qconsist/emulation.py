"""Runs under another instruction set: a child process under QEMU user mode (``qemu-x86_64 -cpu MODEL``).

QEMU user mode translates one Linux process's x86-64 code for another x86-64 processor model: the child's
``cpuid`` answers as the model does (Haswell: AVX2 and FMA3, no VNNI, no AVX-512; Nehalem: SSE4.2, no AVX), so
onnxruntime's MLAS chooses that processor's kernels, and the same Python, onnxruntime and model compute what
that processor computes. Only the instruction set is emulated: the host's memory, files and kernel are the
child's. QEMU's TCG implements no AVX-512, so a model of a processor with AVX-512 runs without it.

``qemu_models()`` lists the models (``qemu-x86_64 -cpu help``); ``resolve_model`` checks a name against it
(case-insensitive; ``QemuModelError``, exit 2, lists the valid ones); ``require_qemu`` raises
``QemuMissingError`` (exit 3) naming the package to install. ``emulated_command`` is the command line of a
child under a model, with the environment that makes its fingerprint record the emulated model
(``qconsist.cpu.EMULATED_ENV``); ``run_emulated`` runs one, passing its output through without QEMU's
warnings about host features TCG does not implement.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import IO, Sequence

from qconsist.cpu import EMULATED_ENV, QEMU_VERSION_ENV
from qconsist.errors import ConfigError, UnavailableError

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


def run_emulated_capture(command: EmulatedCommand, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run the child and return its output (QEMU's TCG warnings dropped from stderr)."""
    done = subprocess.run(command.argv, env=command.env, capture_output=True, text=True, timeout=timeout)
    stderr = "".join(line for line in done.stderr.splitlines(keepends=True) if not _TCG_WARNING.match(line))
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, stderr)
