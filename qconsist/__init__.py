"""qconsist: are your quantized ONNX models reproducible, and if not, which node is to blame?

The main job in one import (``qconsist.api``; ``docs/python-api.md``)::

    import qconsist

    result = qconsist.pipeline_run("pipelines/open_nsfw.toml")            # PipelineResult
    a = qconsist.run(result.path, "package:photos", level="all", dump=True)
    b = qconsist.run(result.path, "package:photos", level="disable", dump=True)
    print(qconsist.diff(a.run_dir, b.run_dir).tensors.first.label)       # DiffResult
    print(qconsist.gate(result.path).passed)                              # GateVerdict

The calls load numpy, onnx and onnxruntime when first made, not on ``import qconsist``.
"""

import importlib as _importlib
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("qconsist")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"

from qconsist.errors import QconsistError  # noqa: E402

_CALLS = ("pipeline_run", "run", "quant_error", "calib_repeat")  # qconsist.api's functions
_PACKAGES = ("diff", "gate")  # packages that are calls too (qconsist.front)

__all__ = ["QconsistError", "__version__", "calib_repeat", "diff", "gate", "pipeline_run", "quant_error", "run"]


def __getattr__(name: str):
    """The top-level calls, imported when first used (``import qconsist`` stays light)."""
    if name in _CALLS:
        return getattr(_importlib.import_module("qconsist.api"), name)
    if name in _PACKAGES:
        return _importlib.import_module(f"qconsist.{name}")
    raise AttributeError(f"module 'qconsist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
