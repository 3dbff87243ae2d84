"""``--isa MODEL``: the command again, in a child process under QEMU user mode emulating that CPU model.

The child is the same Python, qconsist and onnxruntime, given the same arguments without ``--isa``; its
``cpuid`` answers as the emulated processor does, so onnxruntime chooses that processor's kernels and the
run directory the child writes records the emulated instruction set as its environment
(``qconsist.environment.fingerprint``'s ``cpu_isa``). Emulation is slow: the parent says so before the child
starts and says how long the child took after (a measured figure, not an assumed one).
"""

from __future__ import annotations

import sys
import time

import typer

from qconsist.cli.app import QconsistGroup, stderr_console
from qconsist.cpu import InstructionSet
from qconsist.emulation import NATIVE, emulated_command, parse_model, qemu_version, run_emulated

# the child's command line as a manifest records it: ``qconsist run …`` (its environment says it was emulated)
CHILD = "import sys; sys.argv[0] = 'qconsist'; from qconsist.cli import main; main()"


def _without_isa(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--isa":
            skip = True
            continue
        if arg.startswith("--isa="):
            continue
        kept.append(arg)
    return kept


def reexec_under(isa: str, *, quiet: bool = False) -> bool:
    """Run the current command under QEMU emulating ``isa`` and exit with its status; ``False`` (run here)
    when ``isa`` is ``native``. Raises ``QemuMissingError`` (exit 3) or ``QemuModelError`` (exit 2)."""
    model = parse_model(isa)
    if model == NATIVE:
        return False
    args = _without_isa(list(QconsistGroup.arguments))
    verbosity = {1: ["-v"], -1: ["-q"]}.get(QconsistGroup.verbosity, [])
    command = emulated_command(model, [sys.executable, "-c", CHILD, *verbosity, *args])
    console = stderr_console()
    quiet = quiet or QconsistGroup.verbosity < 0  # -q: only errors on stderr
    if not quiet:
        console.print(f"emulating {model} under QEMU {qemu_version()} user mode: the command runs in a child "
                      f"process whose onnxruntime chooses {model}'s kernels; emulation is slow (measured on open_nsfw "
                      f"here: about a thousand times slower than natively; docs/numerics.md): the time it took follows")
    started = time.perf_counter()
    code = run_emulated(command)
    if not quiet:
        console.print(f"emulated {model}: the command took {time.perf_counter() - started:.1f} s under QEMU (exit {code})")
    raise typer.Exit(code)


def isa_line(recorded: dict) -> str:
    """The line a result's figures are qualified by: the instruction set its sessions ran on, as recorded."""
    return f"instruction set: {InstructionSet.from_json(recorded).describe()}" if recorded else "instruction set: unknown"
