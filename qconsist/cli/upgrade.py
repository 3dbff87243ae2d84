"""``qconsist upgrade-check MODEL --onnxruntime X.Y.Z``: the locked environment against one with another
onnxruntime, on the same model and inputs, dumped in both and diffed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console
from qconsist.errors import EXIT_DIVERGED, EXIT_OK


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
    for note in result.notes:
        console.print(f"note: {note}")


def upgrade_check(
    model: opt.ModelArg,
    inputs: opt.Inputs,
    onnxruntime: str = typer.Option(..., "--onnxruntime", help="The onnxruntime version of the second environment, e.g. 1.32.0."),
    stage: opt.Stage = None,
    pipeline: opt.PipelineFile = None,
    offset: opt.Offset = 0,
    count: opt.Count = None,
    ep: opt.Ep = "cpu",
    level: opt.Level = "all",
    threads: opt.Threads = None,
    env_dir: Optional[Path] = typer.Option(None, "--env-dir", help="Where the second environment goes (default: .qconsist/envs/onnxruntime-X.Y.Z in the checkout)."),
    runs_dir: opt.RunsDir = None,
    json_output: opt.Json = False,
) -> None:
    """Run MODEL on the same inputs with dumps in this (locked) environment and in one built from uv.lock with
    only onnxruntime changed, and diff the two: the version change first, then the first diverging node, the
    origin nodes and which nodes onnxruntime's optimizer rewrote differently.

    Exit 0 identical, 1 diverged, 2 error, 3 no uv or no uv.lock here.
    """
    from qconsist.explain.upgrade import upgrade_check as check
    from qconsist.explain.upgrade import upgrade_environment
    from qconsist.inference import resolve_model

    execution = opt.execution_options(ep, level, threads)
    source = resolve_model(model, stage)
    input_set = opt.input_set(inputs, source, pipeline, offset, count)
    args = ["--inputs", inputs, "--offset", str(offset)] + (["--count", str(count)] if count is not None else [])
    if pipeline is not None:
        args += ["--pipeline", str(pipeline.resolve())]
    environment = upgrade_environment(onnxruntime, env_dir)
    label = str(source.describe().get("name") or source.path.stem)
    result = check(source, input_set, args, execution, environment, runs_dir or Path("runs"), label)
    if json_output:
        print_json(result)
    else:
        _render(result)
    raise typer.Exit(EXIT_OK if result.passed else EXIT_DIVERGED)
