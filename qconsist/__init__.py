"""qconsist: are your quantized ONNX models reproducible, and if not, which node is to blame?"""

from typing import Any

from qconsist.errors import QconsistError


def __getattr__(name: str) -> Any:
    """``__version__``, read from the installed package's metadata when asked: importing ``importlib.metadata``
    takes a tenth of a second, in which the ``qconsist`` command could not yet answer a Ctrl-C in one line."""
    if name != "__version__":
        raise AttributeError(f"module 'qconsist' has no attribute {name!r}")
    from importlib import metadata

    try:
        return metadata.version("qconsist")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+source"

__all__ = ["QconsistError", "__version__"]
