"""The ``qconsist`` command line: a thin typer layer over the library.

Each command is a plain function in its own module (``qconsist/cli/<command>.py``) that parses its options
(the shared ones from ``options.py``), calls the library, and renders the typed result. Commands are
registered here, explicitly; errors are mapped to one line and an exit code in one place, the root group's
boundary (``app.py``).

Command modules import the library inside their functions, on purpose: ``qconsist --help`` and a mistyped
option then answer without loading numpy, onnx and onnxruntime (measured: 0.4 s instead of 1.5 s). This is
the one place, with numba in ``qconsist.inference.kernels``, where imports are not at the top
of a module (``tests/test_layers.py`` checks it).
"""

from __future__ import annotations

import time

from qconsist.cli import (
    calib, convert, diff, env, explain, gate, history, inspect, locate, models, nightly, pipeline, quant_error, report, run,
    runs, sensitivity, upgrade, verify,
)
from qconsist.cli.app import PanelCommand, app

COMMANDS = {
    "run": run.run,
    "diff": diff.diff,
    "quant-error": quant_error.quant_error,
    "sensitivity": sensitivity.sensitivity,
    "explain": explain.explain,
    "locate": locate.locate_command,
    "gate": gate.gate,
    "nightly": nightly.nightly,
    "history": history.history,
    "report": report.report,
    "env": env.env,
    "inspect": inspect.inspect,
    "upgrade-check": upgrade.upgrade_check,
    "verify": verify.verify,
    "convert": convert.convert,
}
GROUPS = {
    "pipeline": (pipeline.pipeline_app, {"run": pipeline.run}),
    "calib": (calib.calib_app, {"repeat": calib.repeat}),
    "models": (models.models_app, {"list": models.list_models, "fetch": models.fetch}),
    "runs": (runs.runs_app, {"list": runs.list_command, "show": runs.show, "rm": runs.rm}),
}

# What each command does, in one line of a command list: whole, never cut with "..." (click shortens a
# docstring's first paragraph to the terminal's width).
SUMMARIES = {
    "run": "Run a model on an input set; write an inference run directory.",
    "diff": "Compare two runs: the first difference, the nodes to blame.",
    "quant-error": "Rank a quantized model's nodes by error against the float one.",
    "sensitivity": "Rank quantized nodes by the gain of keeping each in float.",
    "explain": "Name the onnxruntime transformer(s) that make two runs differ.",
    "locate": "Find the GPU nodes that vary; pick a bit-stable config.",
    "gate": "PASS or FAIL a run against its baseline under a policy.",
    "nightly": "Run and judge every model of a nightly file; record history.",
    "history": "A model's nights, and when a hash or the verdict changed.",
    "report": "Write an HTML page for runs, diffs, a night or the history.",
    "env": "Print the environment every run records, with warnings.",
    "inspect": "Show what a run or a model holds.",
    "upgrade-check": "Diff a model's dumps under this and another onnxruntime.",
    "verify": "Verify every file of runs against their manifests.",
    "convert": "Convert a Caffe model to ONNX (the pipeline's convert stage).",
    "pipeline": "Run a pipeline file: Caffe → ONNX → optimized → quantized.",
    "pipeline run": "Run every stage of a pipeline file; print checks and verdict.",
    "calib": "Calibration: repeat it and compare the quantized models.",
    "calib repeat": "Calibrate and quantize N times; compare the quantized models.",
    "models": "Bundled real models: list them, fetch and verify their files.",
    "models list": "List the bundled model descriptions (models/*.toml).",
    "models fetch": "Download a bundled model, verify its sha256 and cache it.",
    "runs": "The run directories of a runs directory: list, show, remove.",
    "runs list": "List the runs of a runs directory, newest first.",
    "runs show": "One run: kind, model, status, size, every file verified.",
    "runs rm": "Remove runs safely (never one being written, nor a baseline).",
}

for _name, _function in COMMANDS.items():
    app.command(_name, cls=PanelCommand, short_help=SUMMARIES[_name])(_function)
for _name, (_group, _commands) in GROUPS.items():
    for _sub, _function in _commands.items():
        _group.command(_sub, cls=PanelCommand, short_help=SUMMARIES[f"{_name} {_sub}"])(_function)
    app.add_typer(_group, name=_name, short_help=SUMMARIES[_name])

__all__ = ["app", "main"]
IMPORTED = time.perf_counter()  # the command line is imported: `qconsist -v run`'s start-up tells its options from it


def main() -> None:
    app()
