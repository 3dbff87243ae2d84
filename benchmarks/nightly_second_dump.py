"""What the across-GPU comparison's second dump costs a night (issue 31, item 3), on the CPU EP standing in for a
GPU: each GPU of an entry with ``devices`` (or ``gpus``) now dumps the quantized model twice, in fresh sessions,
and the head process diffs the two. Runs a local night of the entries asked for (``--only``, small counts by
default as the tests derive them, ``--full`` for the bundled counts), then for each entry times one more dump of
its quantized model on its evaluation set (``nightly.entry._inference``: the CPU EP, one thread, the same call
shape as ``_gpu_dump``) and one diff of its two inference runs (``quantized`` against ``repeat``: what
``across.repeat_check`` does), and prints both against the entry's own seconds.

    .venv/bin/python benchmarks/nightly_second_dump.py --only fcn_head --only open_nsfw-minmax
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from nightly_files import BUNDLED, derived_nightly  # noqa: E402
from qconsist.diff import diff_runs  # noqa: E402
from qconsist.gate.evidence import Side  # noqa: E402
from qconsist.nightly import load_nightly, run_nightly  # noqa: E402
from qconsist.nightly.entry import _inference  # noqa: E402
from qconsist.store.run import Run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", required=True, help="an entry of pipelines/nightly.toml (repeatable)")
    parser.add_argument("--full", action="store_true", help="the bundled counts, not the tests' small ones")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        config = load_nightly(BUNDLED if args.full else derived_nightly(Path(folder), args.only))
        runs = Path(folder) / "runs"
        config = replace(config, runs_dir=runs, history=runs / "history.sqlite")
        night = run_nightly(config, only=tuple(args.only))
        for entry in night.entries:
            roles = {r.role: Path(r.path) for r in entry.runs}
            pipeline = Run.open(roles["pipeline"])
            side = Side(run=pipeline, pipeline=pipeline, labels=None)
            start = time.perf_counter()
            _inference(roles["pipeline"], side, runs, _quiet())
            dump = time.perf_counter() - start
            start = time.perf_counter()
            diff_runs(roles["quantized"], roles["repeat"])
            diff = time.perf_counter() - start
            samples = Run.open(roles["quantized"]).inference.samples
            print(f"{entry.model}: entry {entry.seconds:.2f} s ({entry.status}); one more dump {dump:.2f} s "
                  f"({samples} samples), one more diff {diff:.2f} s: +{dump + diff:.2f} s per GPU, "
                  f"{(dump + diff) / entry.seconds:.1%} of the entry")


def _quiet():
    from qconsist.progress import NULL_PROGRESS
    return NULL_PROGRESS


if __name__ == "__main__":
    main()
