"""``qconsist locate --ep cpu``: instruction sets × integer-path settings (``qconsist.locate.isa``), rendered."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.table import Table

from qconsist.cli.app import print_json, progress_for, stderr_console, stdout_console
from qconsist.errors import EXIT_DIVERGED


def locate_cpu_command(model: Path, stage: str | None, inputs, isa: str | None, runs_dir: Path,  # inputs: InputOptions
                       run_id: str | None, timed_runs: int, json_output: bool) -> None:
    from qconsist.emulation import DEFAULT_MATRIX, parse_models
    from qconsist.locate.isa import SETTINGS, locate_cpu, record_cpu_locate

    isas = parse_models(isa or ",".join(DEFAULT_MATRIX))
    if len(isas) < 2:
        from qconsist.errors import ConfigError

        raise ConfigError("`isa` names one instruction set: locate --ep cpu compares two or more, e.g. native,haswell")
    from qconsist.inference import resolve_model

    resolve_model(model, stage)  # a missing model or stage is said before the plan (one line, exit 2)
    prefix = run_id or f"locate-cpu-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"
    if not json_output:
        emulated = [name for name in isas if name != "native"]
        stderr_console().print(f"locate --ep cpu: {', '.join(isas)} × {len(SETTINGS)} settings; "
                               + (f"{', '.join(emulated)} run under QEMU user mode, which is slow (the time each "
                                  "took is measured and shown)" if emulated else "no emulated instruction set"))
    result = locate_cpu(model, inputs, runs_dir, stage=stage, isas=isas, prefix=prefix,
                        timing_rounds=max(timed_runs, 3), progress=progress_for(json_output))
    import sys

    record_cpu_locate(result, model, stage, runs_dir, prefix, sys.argv)  # the gate and the pipeline read it
    if json_output:
        print_json(result)
    else:
        _render(result)
    if not result.passed:
        raise typer.Exit(EXIT_DIVERGED)


def _render(result) -> None:  # result: CpuLocateResult
    from qconsist.locate.isa import SETTINGS, isa_label

    console = stdout_console()
    isas = list(dict.fromkeys(cell.isa for cell in result.cells))
    console.print(f"model {result.model}: {result.samples} samples, {result.threads} intra-op thread(s), CPU EP")
    for name in isas:
        took = f"; the emulated child took {result.emulated_seconds[name]:.1f} s" if name in result.emulated_seconds else ""
        console.print(f"  {name}: {isa_label(result.instruction_sets.get(name) or {})}{took}")
    table = Table("setting", *isas, "native ms", "cost")
    for setting in SETTINGS:
        row = []
        for name in isas:
            cell = result.cell(name, setting.name)
            if cell.load_error:
                row.append("cannot load")
            elif name != "native" and result.cell("native", setting.name).load_error:
                row.append(f"loads; native cannot ({cell.ms_per_sample:.1f} ms)")
            elif cell.identical_to_native is None:
                row.append(f"reference ({cell.ms_per_sample:.1f} ms)")
            elif cell.identical_to_native:
                row.append(f"identical ({cell.ms_per_sample:.1f} ms)")
            else:
                row.append(f"{cell.differing_samples} differ, max {cell.greatest_abs:.3g} ({cell.ms_per_sample:.1f} ms)")
        timed = setting.name in result.native_ms and setting.name in result.cost
        table.add_row(setting.describe(), *row, f"{result.native_ms[setting.name]:.2f}" if timed else "-",
                      f"{result.cost[setting.name]:.2f}x" if timed else "-")
    console.print(table)
    for name, error in result.cannot_load.items():
        setting = next(s for s in SETTINGS if s.name == name)
        console.print(f"{setting.describe()}: cannot load under this setting: {error}")
    for cell in result.cells:
        if cell.identical_to_native is False and not cell.load_error and not result.cell("native", cell.setting).load_error:
            named = ", ".join(cell.origins[:8]) or "none named (no tensor diverged in the dump)"
            console.print(f"{cell.isa} vs native, {cell.setting}: first diverging node {cell.first_node or '-'}; "
                          f"origin nodes (outputs differ while their inputs are bit-identical): {named}"
                          + (f" … {len(cell.origins) - 8} more" if len(cell.origins) > 8 else ""))
    if result.record:
        console.print(f"record: {result.record} (the gate's [isa] checks and the pipeline's read it by the model's md5)")
    if result.recommended is None:
        console.print("recommendation: none: no setting gave bit-identical outputs on every instruction set"
                      + (" that onnxruntime can load" if result.cannot_load else ""))
        return
    setting = next(s for s in SETTINGS if s.name == result.recommended)
    cost = (f"cost here {result.cost[setting.name]:.2f}x onnxruntime's default ({result.native_ms[setting.name]:.2f} vs "
            f"{result.native_ms['default']:.2f} ms, timed side by side)" if "default" in result.native_ms
            else f"{result.native_ms[setting.name]:.2f} ms here (onnxruntime's default cannot load)")
    console.print(f"recommendation: {setting.describe()}: final outputs bit-identical on {', '.join(isas)}; {cost}")
    if setting.entries:
        console.print(f"  run with: {' '.join(f'--session-config {k}={v}' for k, v in setting.entries)}")
    for cell in result.cells:
        if cell.setting == result.recommended:
            console.print(f"  {cell.isa}: {cell.run_dir}")
