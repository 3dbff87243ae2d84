"""CuPy (``cupy-cuda13x``, extra ``gpu``), imported by one thread at a time.

Two start-up parts may want it at once on the CUDA EP: the page-locking of the input workers' ring
(``pinned``) and the device recorder's start (``device.start``). Imported from two threads at the same moment,
CuPy's Cython modules, which import their own package while it is being initialized, found it partially
initialized and the run ended in an internal error (on an H200: ``partially initialized module 'cupy' has no
attribute '_util'``, in ``cupy._core._routines_math``). Python's per-module import locks let a second thread see a
package that another thread is still initializing where the imports are circular; one lock around the whole
import does not.
"""

from __future__ import annotations

import threading
from typing import Any

_importing = threading.Lock()


def import_cupy() -> Any:
    """CuPy, imported while no other thread of this process imports it through here; ``ImportError`` where it is
    not installed."""
    with _importing:
        import cupy

    return cupy
