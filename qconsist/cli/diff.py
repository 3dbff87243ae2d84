"""``qconsist diff RUN_A RUN_B``: where two runs part, first artifacts, then calibration, tensors, outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console
from qconsist.cli.table import Rows, more
from qconsist.errors import EXIT_DIVERGED, EXIT_OK, ConfigError

_SHOWN = 12


def _num(value: float) -> str:
    return f"{value:.6g}"


def _render(result) -> None:  # result: DiffResult

    console = stdout_console()
    console.print(f"A: {result.run_a}\nB: {result.run_b}")
    for line in result.artifacts.differences:  # before anything else: what the runs ran differs
        console.print(f"runs differ: {line}")
    if result.versions.numerics:
        console.print("WARNING: the runs ran with different versions of what decides the numerics "
                      "(a common cause of other results on the same model):")
        for change in result.versions.numerics:
            console.print(f"  {change}")
    for line in result.options:
        console.print(f"options differ: {line}")
    if result.cause:
        console.print(f"cause: {result.cause}")
    art = result.artifacts
    first = art.first_differing_stage
    if first is not None:
        console.print(f"artifacts: first differing stage: {first}")
    elif art.identical:
        console.print("artifacts: identical")
    else:
        console.print("artifacts: the stages both runs hold are identical; the runs ran different models (above)")
    for stage in art.stages:
        if not stage.same_bytes and stage.same_computation:
            what = "; ".join(line[:120] for line in stage.metadata[:2]) or stage.note
            console.print(f"  {stage.name}: bytes differ, computation identical ({what})")
        if not stage.same_computation and stage.changes is None and stage.note:
            console.print(f"  {stage.name}: {stage.note}")
        if stage.changes:
            ch = stage.changes
            console.print(
                f"  {stage.name}: md5 {stage.md5_a} -> {stage.md5_b}; nodes +{len(ch.nodes_added)} "
                f"-{len(ch.nodes_removed)}, attributes changed {len(ch.attributes_changed)}, "
                f"initializers changed {len(ch.initializers_changed)}"
            )
            qparams = ch.quantization_parameters
            for change in qparams[:_SHOWN]:
                console.print(f"    {change.name} (used by {', '.join(change.consumers[:3])})")
            cut = more(_SHOWN, len(qparams), "scale / zero-point tensors", "--json lists all")
            if cut:
                console.print(f"    {cut}")
    calib = result.calibration
    if calib.compared:
        console.print(f"calibration: {len(calib.changed)} tensor(s) changed range or scale")
        for entry in calib.changed[:_SHOWN]:
            console.print(f"  {entry.tensor}: {', '.join(entry.fields)}")
        cut = more(_SHOWN, len(calib.changed), "tensors", "--json lists all")
        if cut:
            console.print(f"  {cut}")
    tolerance = result.tolerance
    if not tolerance.exact:
        per_node = f"; per node: {', '.join(f'{n.pattern} atol {n.atol:g} rtol {n.rtol:g}' for n in tolerance.nodes)}" if tolerance.nodes else ""
        console.print(f"tolerance: |b - a| <= atol {tolerance.atol:g} + rtol {tolerance.rtol:g}·|a|{per_node}")
    if result.tensors is not None:
        _render_tensors(console, result)
    if result.engines:
        console.print("cuDNN kernels (each run's engine record, cuDNN's API log):")
        for change in result.engines:
            console.print(f"  {change.describe()}")
    if result.outputs is not None:
        o = result.outputs
        from qconsist.compare.output import describe_judgement

        top1 = f", top-1 agreement {100 * o.top1_agreement:.1f}%" if o.top1_agreement is not None else ""
        console.print(f"final outputs: {len(o.differing_samples)}/{o.samples} samples differ, greatest abs difference "
                      f"{_num(o.greatest_abs)}{top1}")
        for entry in result.judged:  # each output (and part) judged for what it is, B against A
            console.print(f"  {describe_judgement(entry)}")
    for stat in result.output_stats:
        console.print(f"output {stat.name}: {stat.message()}")
    if result.accuracy is not None:
        _render_accuracy(console, result.accuracy)
    for note in result.notes:
        console.print(f"note: {note}")
    console.print("PASS — verdict: identical" if result.passed else "FAIL — verdict: diverged")


_LONGEST_COMMAND = 400  # characters: a command longer than that is not copied from a terminal


def _short_capture(command: str, other) -> str:
    """A re-run command that names its raw tensors (``--raw A,B,…``, thousands of characters on a real model)
    asks instead for the tensors that differ from the other run's dump (``--raw auto --reference OTHER``)."""
    import shlex

    if len(command) <= _LONGEST_COMMAND or " --raw " not in command:
        return command
    return command.rsplit(" --raw ", 1)[0] + f" --raw auto --reference {shlex.quote(str(Path(other).resolve()))}"


def _shown_nodes(listed: list, first) -> list:
    """The rows of the node table, in the graph's order: every origin and span, the first diverging node, then the
    others up to ``_SHOWN`` rows."""
    keep = {id(node) for node in listed if node.finding or node is first}
    room = max(_SHOWN - len(keep), 0)
    for node in listed:
        if room and id(node) not in keep:
            keep.add(id(node))
            room -= 1
    return [node for node in listed if id(node) in keep]


def _render_tensors(console, result) -> None:  # result: DiffResult with tensors
    from qconsist.compare.statistics import histogram_items

    tensors, tolerance = result.tensors, result.tolerance
    if tensors.layout_unknown:
        shown = ", ".join(tensors.layout_unknown[:5]) + (f", … {len(tensors.layout_unknown) - 5} more" if len(tensors.layout_unknown) > 5 else "")
        console.print(f"not compared: {len(tensors.layout_unknown)} tensor(s) whose layout ORT's graph does not establish ({shown})")
    if tensors.blocked_apart:
        shown = ", ".join(tensors.blocked_apart[:5]) + (f", … {len(tensors.blocked_apart) - 5} more" if len(tensors.blocked_apart) > 5 else "")
        console.print(f"not compared: {len(tensors.blocked_apart)} tensor(s) held in NCHWc blocks of different or unrecorded sizes "
                      f"and not both recorded in NCHW ({shown}); the origin rule walks across them")
    if tensors.branches_unobserved:
        console.print(f"not compared: {tensors.branches_unobserved}")
    for apart in tensors.branches_apart:  # an If whose runs took different branches: its condition differs upstream
        console.print(f"branches: the runs took different branches of If {apart['node']} in {apart['count']} sample(s) "
                      f"{apart['samples'][:8]} (A {apart['a']}, B {apart['b']} in sample {apart['samples'][0]}): its condition "
                      "differs upstream; the tensors of its branches are not compared there")
    if not tolerance.exact and tensors.nodes:
        beyond = [n for n in tensors.nodes if n.tolerance == "beyond"]
        unknown = [n for n in tensors.nodes if n.tolerance == "unknown"]
        console.print(f"beyond the tolerance: {len(beyond)} of {len(tensors.nodes)} diverging node(s)"
                      + (f", first {beyond[0].label}" if beyond else "")
                      + (f"; {len(unknown)} undecided without raw tensors" if unknown else ""))
    if not tensors.nodes:
        console.print(f"tensors: {tensors.compared} compared, all bit-identical in {tensors.samples} samples")
    else:
        origins, spans = tensors.origins, tensors.spans
        console.print(
            f"tensors: {len(tensors.nodes)} of {tensors.compared} diverge ({tensors.space} graph); "
            f"first diverging node: {tensors.first.label}; origin nodes: {len(origins)}"
            + (f"; spans: {len(spans)}" if spans else "")
        )
        columns = ["node", "op A / B", "kind", "samples", "mismatched elements", "max abs", "max rel", "max ULP / ±LSB"]
        table = Rows(*columns, *(["tolerance"] if not tolerance.exact else []))
        listed = tensors.beyond  # with a tolerance, the nodes beyond it (or undecided); exact: every diverging node
        shown = _shown_nodes(listed, tensors.first)
        for node in shown:
            e = node.elements
            mismatch = f"{e.differing} / {e.elements} ({e.percent:.2f}%)" if e else "raw not kept"
            extra = "-"
            if e and e.max_ulp is not None:
                extra = str(e.max_ulp)
            elif e and e.histogram:
                extra = " ".join(f"{k}:{v}" for k, v in histogram_items(e.histogram))
            table.add(
                node.label, f"{node.op_a} / {node.op_b}", node.finding or "propagates",
                f"{node.count}/{tensors.samples}", mismatch,
                _num(e.max_abs) if e else "-", _num(e.max_rel) if e else "-", extra,
                *([node.tolerance] if not tolerance.exact else []),
            )
        if shown:
            table.print(console)
        what = "diverging nodes" if tolerance.exact else "nodes beyond the tolerance"
        cut = more(len(shown), len(listed), what, "--json lists all")
        if cut:
            console.print(cut)
        for node in tensors.nodes:
            if node.finding:
                console.print(_finding(node))
        if result.capture:
            console.print("element statistics need raw tensors; capture them with:")
            for command, other in zip(result.capture, (result.run_b, result.run_a)):
                console.print(f"  {_short_capture(command, other)}")
        _render_replays(console, result.replays)


def _render_replays(console, replays) -> None:  # replays: list[NodeReplay]
    for replay in replays:
        console.print(f"replay {replay.label or replay.nodes[0]}: {replay.summary()}")
        for tensor, source in replay.sources.items():
            console.print(f"  input {tensor}: {source}")
        across = replay.instruction_sets()
        if across:
            console.print(f"  instruction sets: {across}")
        for side in replay.sides:
            if side.recorded:
                where = f" {side.where()}" if replay.off_native else ""
                verb = "differs from" if side.recorded == "differs" else side.recorded
                console.print(f"  under {side.run}'s options{where} the replay {verb} what run {side.run} recorded")
        for note in replay.notes:
            console.print(f"  note: {note}")
        for command in replay.capture:
            console.print(f"  {command}")


def _finding(node) -> str:  # node: TensorDiff, an origin or a span
    samples = f"samples {node.origin_samples[:8]}"
    if node.is_span:
        shown = ", ".join(node.unobserved[:6]) + (", ..." if len(node.unobserved) > 6 else "")
        return (f"span ending at {node.label}: its output differs while its nearest observed inputs are identical "
                f"({node.evidence()}; {samples}); not observed: {shown}; nodes inside: {', '.join(node.span)}")
    if node.initializers_changed:
        return f"origin {node.label}: outputs differ while every input it reads was compared ({node.evidence()}; {samples})"
    if node.inputs or node.given or node.constants:
        return f"origin {node.label}: outputs differ while every input it reads is identical ({node.evidence()}; {samples})"
    return f"origin {node.label}: outputs differ ({samples}; recorded before qconsist kept an origin's evidence)"


def _render_accuracy(console, change) -> None:  # change: AccuracyChange
    console.print(change.summary())
    for flip in change.flipped[:_SHOWN]:
        console.print(f"  {flip.describe()}")
    cut = more(_SHOWN, change.flipped_count, "flipped predictions", f"--json lists {len(change.flipped)}")
    if cut:
        console.print(f"  {cut}")


def diff(
    run_a: Path = typer.Argument(..., help="First run directory."),
    run_b: Path = typer.Argument(..., help="Second run directory."),
    explorer: Optional[Path] = typer.Option(None, "--explorer", help="Also write the per-node divergence as Google Model Explorer node data into this folder (status, mismatched, greatest_difference, origin .json)."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Tensors and final outputs only diverge beyond atol + rtol·|a| (the tensor's own units: 1 on an int8 tensor is one quantum). Default: exact, bit for bit."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Relative tolerance (see --atol)."),
    policy: opt.told(opt.PolicyFile, "Policy file (TOML; default: the built-in defaults, see policies/default.toml): its [diff] tolerances (atol, rtol, per node); --atol/--rtol override them.") = None,
    replay: bool = typer.Option(False, "--replay", help="Confirm each origin and span by replay: rebuild it (the original nodes between the tensors both runs observed and its output) as a small model, feed it the recorded inputs (the input set, opened again, and the raw tensors kept with `qconsist run --dump --raw`) and run it under each run's execution options, on the instruction set each run recorded (see --isa): confirmed in isolation, does not reproduce in isolation (fusion or context), or cannot replay (with the command that records the missing inputs)."),
    isa: opt.told(opt.Isa, "Run under another instruction set: with --replay, both runs' replays on this one, a QEMU CPU model (haswell: AVX2 without VNNI; nehalem: SSE4.2, no AVX; `qemu-x86_64 -cpu help` lists them), in a child process under QEMU user mode (package qemu-user), or native (this processor). Default: each run on the one it recorded (a run made with `qconsist run --isa haswell` again under emulated Haswell), and where the two differ, both runs' options also under each, which says whether the instruction set alone makes the difference.", panel=None) = None,
    json_output: opt.Json = False,
) -> None:
    """Compare two runs: first differing stage, calibration, first diverging and origin nodes, outputs.
    Exact by default; with --atol/--rtol (or a policy's [diff]), which nodes differ by more than that.
    With --replay, each origin and span is confirmed (or not) by running it alone on its recorded inputs,
    each run on the instruction set it recorded (under QEMU user mode for a run made with --isa), or on the
    one --isa names.

    Exit 0 identical (within the tolerance), 1 diverged, 2 error (incomplete, modified or damaged runs,
    different models or input sets, --isa without --replay or a CPU model QEMU does not know), 3 --isa
    without QEMU.
    """
    from qconsist.compare.tolerance import Tolerance
    from qconsist.diff import diff_runs

    if isa is not None and not replay:
        raise ConfigError("--isa chooses the instruction set of --replay: give --replay too (diff itself compares "
                          "what the runs recorded)")
    if isa is not None:
        from qconsist.emulation import parse_model

        isa = parse_model(isa)  # before the diff: exit 3 without QEMU, 2 for a model it does not know
    base = Tolerance()
    if policy is not None:
        from qconsist.gate import load_policy

        base = load_policy(policy).diff
    result = diff_runs(run_a, run_b, base.with_overrides(atol, rtol))
    if replay:
        from qconsist.explain.confirm import confirm_origins

        confirm_origins(result, isa=isa)
    if explorer is not None:
        from qconsist.report.explorer import explorer_overlay

        overlay = explorer_overlay(result)
        paths = overlay.write(explorer)
        if not json_output:
            stdout_console().print(f"Model Explorer node data: {', '.join(map(str, paths))} (open {overlay.model} "
                                   "with model-explorer and load them as node data)")
    if json_output:
        print_json(result)
    else:
        _render(result)
    raise typer.Exit(EXIT_OK if result.passed else EXIT_DIVERGED)
