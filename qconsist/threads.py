"""Recorded figures do not change with the machine's thread counts.

Two libraries split work by their thread count, and a float sum split otherwise rounds otherwise:

* **BLAS** (numpy's ``@`` / ``matmul``: the Caffe reference's convolutions). OpenBLAS's threaded GEMM
  blocks the reduction by thread count: open_nsfw's reference output with the Haswell kernel (AVX2 machines)
  is 0.91317010 on 1 thread and 0.91316998 on 2 — the figures of issue 22. ``one_blas_thread`` runs a
  computation on one BLAS thread, whatever ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
  said when numpy was imported (``threadpoolctl``, which sets the loaded BLAS library's own thread count).
* **onnxruntime's CPU execution provider** partitions convolutions by its intra-op thread count, whose default
  is one per physical core: open_nsfw's float graph without optimizations (what ORT's calibrator runs) changes
  68 of 123 tensors at 3 threads or more, its QDQ graph 99 of 344, so calibration ranges, and the quantized
  model's md5 with them, differed between a 2-core and a 16-core machine. Every session qconsist opens to
  measure something itself (stage checks, calibration, references) runs with ``MEASUREMENT_THREADS``
  intra-op threads (``qconsist.inference.session.measurement_options``); a session that observes the
  user's own execution options (``qconsist run``, ``locate``) runs with them as given.

One thread is the only count that every machine has, so a figure computed this way is the same on each
(given the same libraries and CPU kind: a kernel built for another instruction set rounds otherwise).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from threadpoolctl import threadpool_limits

MEASUREMENT_THREADS = 1


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block on one BLAS thread (numpy's BLAS, as loaded); the previous count is restored after."""
    with threadpool_limits(limits=MEASUREMENT_THREADS, user_api="blas"):
        yield
