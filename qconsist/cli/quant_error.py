"""``qconsist quant-error RUN``: where a quantized model departs from its float model, node by node."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, progress_for, stdout_console
from qconsist.cli.emulated import isa_line, reexec_under
from qconsist.cli.table import Rows, more
from qconsist.errors import EXIT_DIVERGED, EXIT_OK

if TYPE_CHECKING:
    from qconsist.inference.session import ExecutionOptions
    from qconsist.inputs.options import InputOptions


NEGLIGIBLE = 5e-6  # a weight or bias off by no more than this is not ranked among the worst


def _db(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _render(result, top: int, sort: str) -> None:  # result: QuantErrorResult
    console = stdout_console()
    q, f = result.quantized_options, result.float_options
    console.print(
        f"{result.run}: {result.quantized_stage} ({q['provider']}, level {q['graph_optimization_level']}) against "
        f"{result.float_stage} ({f['provider']}, level {f['graph_optimization_level']}), {result.samples} samples"
    )
    console.print(f"tensors: {len(result.tensors) + len(result.outputs)} matched to the float model; left out: "
                  f"{result.constants} constants (dequantized weights and biases), {len(result.internal)} with no float twin")
    from qconsist.compare.statistics import MEASURED, sqnr_cell, sqnr_phrase
    from qconsist.diff.quantization import ranked_by_added

    ranked = result.tensors if sort == "sqnr" else ranked_by_added(result.tensors)
    table = Rows("node", "op", "SQNR dB", "added dB", "max abs", "mean abs", "cosine", "observed", "as")
    for e in ranked[:top]:
        added = "all (inputs identical)" if e.noise_starts else _db(e.added_db)
        table.add(e.node, e.op_type, sqnr_cell(e.sqnr_db, e.figure), added, f"{e.max_abs:.4g}", f"{e.mean_abs:.4g}",
                  f"{e.cosine:.5f}" if e.figure == MEASURED else "-", e.observed, e.how)
    table.print(console)
    cut = more(top, len(ranked), "nodes", "--top N, --json")
    if cut:
        console.print(cut)
    for e in result.outputs:
        cosine = f", cosine {e.cosine:.6f}" if e.figure == MEASURED else ""
        console.print(f"final output {e.tensor}: {sqnr_phrase(e.sqnr_db, e.figure, 2)}, greatest abs difference {e.max_abs:.4g}{cosine}")
    if result.weights:
        # a bias of a few millionths rounds to 0 (SQNR 0 dB) while changing nothing: not the worst weight
        tiny = [w for w in result.weights if w.max_abs <= NEGLIGIBLE]
        ranked = [w for w in result.weights if w.max_abs > NEGLIGIBLE]
        shown = ", ".join(f"{w.tensor} ({w.node}) {sqnr_phrase(w.sqnr_db, w.figure, 2)}" for w in ranked[:3]) or "none above the negligible"
        console.print(f"weights and biases: {len(result.weights)} dequantized, lowest SQNR: {shown}"
                      + (f"; {len(tiny)} left out of the ranking: off by at most {NEGLIGIBLE:g} (--json lists them)" if tiny else ""))
    for line in result.mismatched:
        console.print(f"WARNING: observation NOT faithful: {line}")
    console.print(isa_line(result.instruction_set))
    console.print(f"cost: {result.seconds:.1f} s, peak RSS {result.peak_rss_mb:.0f} MB")


def _evaluation_inputs(run: Path, inputs):  # -> InputSet
    """The run's own evaluation inputs (sliced by ``offset``/``count``), as ``sensitivity`` takes them."""
    from qconsist.errors import ConfigError
    from qconsist.sensitivity.source import open_quantized_run

    if inputs.pipeline is not None:
        raise ConfigError("`pipeline` prepares the images of `inputs`: give `inputs` too (without it, the run's own "
                          "evaluation inputs are used, prepared as the run prepared them)")
    evaluation = open_quantized_run(run).inputs("evaluation")
    return evaluation.subset(inputs.offset, inputs.count) if inputs.offset or inputs.count is not None else evaluation


@opt.uses(inputs=opt.INPUTS.with_defaults(inputs=None).told(
    inputs=opt.INPUTS_HELP[:-1] + " (default: the run's own evaluation inputs, prepared as the run prepared them)."),
    execution=opt.EXECUTION)
def quant_error(
    run: Path = typer.Argument(..., help="A pipeline run directory (its float and quantized stages)."),
    *,
    inputs: InputOptions,
    stage: opt.Stage = None,
    float_stage: str = typer.Option("optimize", "--float-stage", help="The stage whose float model is the reference (default: optimize)."),
    float_level: str = typer.Option("disable", "--float-level", help="Optimization level the float model is observed at (default: disable, where every float tensor exists)."),
    execution: ExecutionOptions,
    top: opt.Top = 20,
    sort: str = typer.Option("sqnr", "--sort", help="sqnr: lowest SQNR first; added: the nodes that lose the most SQNR first."),
    json_output: opt.Json = False,
    isa: opt.Isa = None,
) -> None:
    """Rank the nodes of a quantized model by their error against the float model (SQNR, greatest and mean
    difference, cosine), the quantized model observed as ORT runs it in production, one sample at a time.

    With --isa MODEL both models run in a child process under QEMU user mode emulating that CPU model (its
    integer kernels: Haswell's u8·s8 sums saturate where VNNI's do not), and the result records it.

    Exit 0 done, 1 an observation was not faithful (its final outputs differ from production), 2 error, 3 --isa
    without QEMU.
    """
    if isa is not None and reexec_under(isa, quiet=json_output):
        return
    from qconsist.diff.quantization import quantization_error
    from qconsist.errors import ConfigError
    from qconsist.inference import resolve_model
    from qconsist.pipeline.inputs import open_inputs

    if sort not in ("sqnr", "added"):
        raise ConfigError(f"`sort` must be sqnr or added, got {sort!r}")
    source = resolve_model(run, stage)
    input_set = (_evaluation_inputs(source.run.path if source.run is not None else run, inputs) if inputs.source is None
                 else open_inputs(inputs, source))
    result = quantization_error(source.run or run, input_set, execution, float_stage=float_stage, quantized_stage=source.stage or "quantize",
                                float_level=float_level, progress=progress_for(json_output))
    if json_output:
        print_json(result)
    else:
        _render(result, top, sort)
    raise typer.Exit(EXIT_OK if result.passed else EXIT_DIVERGED)
