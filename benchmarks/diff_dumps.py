"""Time and peak memory of `qconsist diff` on two dumps (fingerprints only).

Usage: .venv/bin/python benchmarks/diff_dumps.py RUN_A RUN_B
"""

from __future__ import annotations

import resource
import sys
import time

from qconsist.diff import diff_runs

start = time.perf_counter()
result = diff_runs(sys.argv[1], sys.argv[2])
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t = result.tensors
print(f"diff wall={wall:.2f}s peak_rss_mb={peak:.0f} samples={t.samples if t else 0} compared={t.compared if t else 0} "
      f"diverging={len(t.nodes) if t else 0} passed={result.passed}")
