"""``qconsist explain RUN_A RUN_B``: the onnxruntime graph transformer that makes two runs diverge."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, progress_for, stdout_console
from qconsist.cli.emulated import isa_line, reexec_under
from qconsist.errors import EXIT_DIVERGED, EXIT_OK

if TYPE_CHECKING:
    from qconsist.inputs.options import InputOptions


def _options(data: dict) -> str:
    disabled = data.get("disabled_optimizers") or []
    return f"level {data['graph_optimization_level']}" + (f", switched off: {', '.join(disabled)}" if disabled else "")


def _render(result) -> None:  # result: OptimizerExplanation
    console = stdout_console()
    console.print(f"reference: {result.reference_run} ({_options(result.reference_options)})")
    console.print(f"optimized: {result.optimized_run} ({_options(result.optimized_options)})")
    if result.target is None:
        for note in result.notes:
            console.print(f"note: {note}")
        console.print("verdict: identical, nothing to explain")
        return
    console.print(f"first diverging node: {result.target} ({result.diverging} of {result.compared} tensors diverge)")
    names = ", ".join(f"{t.name} (level {t.level})" for t in result.candidates) or "none"
    console.print(f"onnxruntime {result.onnxruntime}: {len(result.candidates)} graph transformer(s) changed the graph in the "
                  f"optimized run and not in the reference: {names}")
    for probe in result.probes:
        what = result.target if probe.observed == "target" else "the tensors (the first diverging one is fused away)"
        console.print(f"  probe: switched off {', '.join(probe.disabled)} -> {what} "
                      f"{'diverges' if probe.target_diverges else 'bit-identical'}; {probe.diverging} tensor(s) "
                      f"diverge ({probe.seconds:.2f} s)")
    if result.explained:
        verification = result.verification
        console.print(f"responsible: {', '.join(result.responsible)}")
        remaining = (f"{verification.diverging} tensor(s) still diverge, first {verification.first}"
                     if verification.diverging else "no tensor diverges any more")
        console.print(f"  verified: with only {', '.join(result.responsible)} switched off, {result.target} is "
                      f"bit-identical to the reference ({remaining})")
        for node in result.rewritten:
            console.print(f"  rewrote: {node}")
        for node in result.replaced:
            console.print(f"  in place of: {node}")
        if result.rewrites is not None:
            console.print(f"  optimized graph: {result.rewrites.summary()} ({result.rewrites.nodes_before} -> "
                          f"{result.rewrites.nodes_after} nodes)")
        if result.reproduce:
            console.print(f"  check it: {result.reproduce}")
    for note in result.notes:
        console.print(f"note: {note}")
    probes = len(result.probes)
    console.print(isa_line(result.instruction_set))
    console.print(f"cost: {result.sessions} sessions (2 reading onnxruntime's optimizer log, {probes} probe(s) × 3), "
                  f"{result.seconds:.1f} s")
    console.print("verdict: " + ("explained" if result.explained else "not explained"))


@opt.uses(inputs=opt.INPUTS.with_defaults(inputs=None))
def explain(
    run_a: Path = typer.Argument(..., help="An inference run with dumps (`qconsist run --dump`)."),
    run_b: Path = typer.Argument(..., help="The same model on the same inputs with dumps, at another optimization level."),
    *,
    inputs: InputOptions,
    json_output: opt.Json = False,
    isa: opt.Isa = None,
) -> None:
    """Name the onnxruntime graph transformer(s) that make two runs diverge: the minimal set whose switching off
    makes the first diverging node bit-identical again, the nodes it rewrote, and the cost in sessions.

    The runs must differ only in the optimization level (or transformers switched off). The inputs are opened
    again from the run's manifest unless --inputs is given. Runs made under another instruction set
    (`qconsist run --isa MODEL`) are explained under it: --isa MODEL runs the probes in a child process under
    QEMU user mode emulating that CPU model. Exit 0 explained (or identical), 1 not explained, 2 error, 3 --isa
    without QEMU.
    """
    if isa is not None and reexec_under(isa, quiet=json_output):
        return
    from qconsist.explain import explain_optimization

    input_set = None
    if inputs.source is not None:
        from qconsist.inference import resolve_model
        from qconsist.pipeline.inputs import open_inputs

        input_set = open_inputs(inputs, resolve_model(run_a))
    result = explain_optimization(run_a, run_b, input_set, progress=progress_for(json_output))
    if json_output:
        print_json(result)
    else:
        _render(result)
    raise typer.Exit(EXIT_OK if result.passed else EXIT_DIVERGED)
