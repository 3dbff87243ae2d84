"""qconsist: are your quantized ONNX models reproducible, and if not, which node is to blame?"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("qconsist")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"

from qconsist.errors import QconsistError  # noqa: E402

__all__ = ["QconsistError", "__version__"]
