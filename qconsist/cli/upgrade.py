"""``qconsist upgrade-check MODEL --onnxruntime X.Y.Z``: the locked environment against one with another
onnxruntime, on the same model and inputs, dumped in both and diffed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console
from qconsist.errors import EXIT_DIVERGED, EXIT_OK

if TYPE_CHECKING:
    from qconsist.inference.session import ExecutionOptions
    from qconsist.inputs.options import InputOptions


def _render(result) -> None:  # result: UpgradeResult
    from qconsist.cli.diff import _render as render_diff

    console = stdout_console()
    env = result.environment
    how = f"built in {env.seconds:.1f} s" if env.built else "reused"
    console.print(f"environment B: {env.path} (uv.lock with onnxruntime=={env.onnxruntime}; {how})")
    render_diff(result.diff)
    if result.rewrites is not None:
        r = result.rewrites
        console.print(f"onnxruntime's optimized graph differs: {r.summary()} ({r.before}: {r.nodes_before} nodes, "
                      f"{r.after}: {r.nodes_after})")
        for node in r.removed[:8]:
            console.print(f"  only with {r.before}: {node}")
        for node in r.added[:8]:
            console.print(f"  only with {r.after}: {node}")
    elif result.diff.tensors is not None:
        console.print("onnxruntime's optimized graph: the same nodes in both environments")
    if result.isa != "native":
        from qconsist.cli.emulated import isa_line

        took = ", ".join(f"{side} {seconds:.1f} s" for side, seconds in result.emulated_seconds.items())
        console.print(f"both runs under emulated {result.isa} (QEMU user mode; the runs took {took}); {isa_line(result.instruction_set)}")
    for note in result.notes:
        console.print(f"note: {note}")


@opt.uses(inputs=opt.INPUTS, execution=opt.EXECUTION, runs_dir=opt.RUNS)
def upgrade_check(
    model: opt.ModelArg,
    *,
    inputs: InputOptions,
    onnxruntime: str = typer.Option(..., "--onnxruntime", help="The onnxruntime version of the second environment, e.g. 1.32.0."),
    stage: opt.Stage = None,
    execution: ExecutionOptions,
    env_dir: Optional[Path] = typer.Option(None, "--env-dir", help="Where the second environment goes (default: .qconsist/envs/onnxruntime-X.Y.Z in the checkout)."),
    runs_dir: Path,
    isa: opt.told(opt.Isa, "Run under another instruction set: both runs, on a QEMU CPU model (haswell: AVX2 without VNNI; nehalem: SSE4.2, no AVX; `qemu-x86_64 -cpu help` lists them), each in its environment's `qconsist run --isa MODEL` (a child process under QEMU user mode, package qemu-user), so both record the emulated instruction set; much slower (docs/numerics.md). native (the default): this processor.") = None,
    json_output: opt.Json = False,
) -> None:
    """Run MODEL on the same inputs with dumps in this (locked) environment and in one built from uv.lock with
    only onnxruntime changed, and diff the two: the version change first, then the first diverging node, the
    origin nodes and which nodes onnxruntime's optimizer rewrote differently. With --isa MODEL both runs are
    made under QEMU user mode emulating that CPU model.

    Exit 0 identical, 1 diverged, 2 error (a CPU model QEMU does not know), 3 no uv or no uv.lock here, or
    --isa without QEMU.
    """
    from qconsist.emulation import NATIVE, parse_model
    from qconsist.upgrade.check import upgrade_check as check
    from qconsist.upgrade.check import upgrade_environment
    from qconsist.inference import resolve_model
    from qconsist.pipeline.inputs import open_inputs

    chosen = parse_model(isa) if isa is not None else NATIVE  # first: exit 3 without QEMU, 2 for an unknown model
    source = resolve_model(model, stage)
    input_set = open_inputs(inputs, source)
    environment = upgrade_environment(onnxruntime, env_dir)
    label = str(source.describe().get("name") or source.path.stem)
    result = check(source, input_set, inputs.to_args(), execution, environment, runs_dir, label, chosen)
    if json_output:
        print_json(result)
    else:
        _render(result)
    raise typer.Exit(EXIT_OK if result.passed else EXIT_DIVERGED)
