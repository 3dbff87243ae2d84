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

from qconsist.cli import (
    calib, convert, diff, env, explain, gate, history, inspect, locate, models, nightly, pipeline, quant_error, report, run,
    runs, sensitivity, upgrade, verify,
)
from qconsist.cli.app import app

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

for _name, _function in COMMANDS.items():
    app.command(_name)(_function)
for _name, (_group, _commands) in GROUPS.items():
    for _sub, _function in _commands.items():
        _group.command(_sub)(_function)
    app.add_typer(_group, name=_name)

__all__ = ["app", "main"]


def main() -> None:
    app()
