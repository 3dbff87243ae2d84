"""What verification on read costs: ``qconsist verify`` on a run (time, bytes, peak RSS), and the share of a
gate spent verifying files (hashing seconds inside ``evaluate_gate``, against the gate's total).

    python benchmarks/verify_cost.py verify RUN [RUN…]
    python benchmarks/verify_cost.py gate CANDIDATE BASELINE [-n 3]

Run each in a fresh process (the hash cache lives for one command). Figures go into the closing notes.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def verify(runs: list[str]) -> None:
    from qconsist.store.runs import verify_run
    from qconsist.store.verify import reset_cache

    for run in runs:
        reset_cache()
        start = time.perf_counter()
        result = verify_run(run)
        seconds = time.perf_counter() - start
        print(f"verify {run}: {'verified' if result.passed else 'NOT verified'}, {len(result.files)} files, "
              f"{result.bytes / 1e6:.1f} MB hashed in {seconds:.3f} s ({result.bytes / 1e6 / seconds:.0f} MB/s), "
              f"peak RSS {_rss_mb():.0f} MB")


def gate(candidate: str, baseline: str, repeats: int) -> None:
    from qconsist.gate import evaluate_gate
    from qconsist.gate.policy import Policy
    from qconsist.store.verify import COST, reset_cache

    totals, hashing, sizes = [], [], []
    for _ in range(repeats):
        reset_cache()
        start = time.perf_counter()
        verdict = evaluate_gate(candidate, baseline, Policy())
        totals.append(time.perf_counter() - start)
        hashing.append(COST.seconds)
        sizes.append((COST.files, COST.bytes, COST.cached))
    total, spent = statistics.median(totals), statistics.median(hashing)
    files, size, cached = sizes[0]
    print(f"gate {candidate} vs {baseline}: {'PASS' if verdict.passed else 'FAIL'}; median of {repeats}: "
          f"{total:.3f} s in all, {spent:.3f} s verifying {files} files ({size / 1e6:.1f} MB; {cached} reuses "
          f"from the per-command cache); gate / gate without verification = {total / (total - spent):.3f}; "
          f"peak RSS {_rss_mb():.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    v = sub.add_parser("verify")
    v.add_argument("runs", nargs="+")
    g = sub.add_parser("gate")
    g.add_argument("candidate")
    g.add_argument("baseline")
    g.add_argument("-n", type=int, default=3)
    args = parser.parse_args()
    if args.what == "verify":
        verify(args.runs)
    else:
        gate(args.candidate, args.baseline, args.n)


if __name__ == "__main__":
    sys.exit(main())
