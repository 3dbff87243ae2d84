"""An evaluation of many samples, dumped twice and diffed: wall time, disk, RSS over time, diff time.

Usage: python benchmarks/scale_evaluation.py MODEL [--count 50000] [--batch 32] [--ep cuda] [--runs DIR]

The samples are ``package:photos:augmented:COUNT:0`` (the bundled photos, seeded crops and flips, made when
read; open_nsfw's preprocessing from pipelines/open_nsfw.toml). Each of the two runs is
``qconsist run MODEL --inputs package:photos:augmented:COUNT:0 --pipeline pipelines/open_nsfw.toml --ep EP
--batch-size BATCH --dump`` done through the library; the diff is ``qconsist diff A B``. Progress with an
ETA goes to stdout every 10%; RSS is sampled every second, so a flat curve shows the dump streams.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.start_time = time.perf_counter()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.samples.append((time.perf_counter() - self.start_time, rss_mb()))


class PrintedProgress:
    """Progress with an ETA, one line every 10%."""

    @contextmanager
    def task(self, description: str, total: int | None):
        start, done, marks = time.perf_counter(), [0], [0]

        class Handle:
            def advance(self, amount: int = 1) -> None:
                done[0] += amount
                if total and done[0] * 10 // total > marks[0]:
                    marks[0] = done[0] * 10 // total
                    spent = time.perf_counter() - start
                    eta = spent / done[0] * (total - done[0])
                    print(f"  {description}: {done[0]}/{total} ({done[0] / spent:.0f} samples/s, "
                          f"elapsed {spent:.0f} s, ETA {eta:.0f} s, RSS {rss_mb():.0f} MB)", flush=True)

        yield Handle()


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("--count", type=int, default=50000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ep", default="cuda")
    parser.add_argument("--runs", type=Path, default=Path("runs/scale"))
    args = parser.parse_args()
    if args.ep == "cuda":
        import onnxruntime

        onnxruntime.preload_dlls()
    from qconsist.diff import diff_runs
    from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline

    preprocess = load_pipeline(REPO / "pipelines" / "open_nsfw.toml").preprocess
    source = resolve_model(args.model)
    name = input_specs(source.path)[0].name
    inputs = open_input_set(f"package:photos:augmented:{args.count}:0", preprocess, name)
    options = ExecutionOptions(args.ep, {"cudnn_conv_algo_search": "HEURISTIC"} if args.ep == "cuda" else {})
    sampler = Sampler()
    sampler.start()
    runs, total = [], time.perf_counter()
    for run_id in ("a", "b"):
        start = time.perf_counter()
        result = run_inference(source, inputs, RunRequest(options, dump=True, batch_size=args.batch), args.runs,
                               run_id=f"scale-{run_id}", progress=PrintedProgress())
        wall = time.perf_counter() - start
        runs.append(result)
        d = result.dump
        print(f"run {run_id}: {result.samples} samples in {wall:.1f} s ({result.samples / wall:.0f} samples/s); production "
              f"{result.ms_per_sample:.3f} ms/sample, dump {d.ms_per_sample:.3f} ms/sample {d.seconds_per_sample}; "
              f"fingerprints on the {d.fingerprints_on}; faithful {d.faithful} in {d.samples_checked} samples; "
              f"disk {du(result.run_dir) / 1e6:.0f} MB (fingerprints.npy "
              f"{(result.run_dir / 'dump' / 'fingerprints.npy').stat().st_size / 1e6:.0f} MB)", flush=True)
    start = time.perf_counter()
    diff = diff_runs(runs[0].run_dir, runs[1].run_dir)
    diff_seconds = time.perf_counter() - start
    sampler.stop.set()
    t = diff.tensors
    print(f"diff: {diff_seconds:.1f} s; passed {diff.passed}; {t.compared} tensors compared over {t.samples} samples; "
          f"{len(t.nodes)} diverging; first {t.first.label if t.first else None}; origins {[n.label for n in t.origins]}")
    print(f"total (two dumps + diff): {time.perf_counter() - total:.1f} s; disk of both runs {du(args.runs) / 1e6:.0f} MB")
    curve = sampler.samples
    if curve:
        tenth = max(1, len(curve) // 10)
        print("RSS MB over time (s, MB), every tenth sample: " + " ".join(f"({s:.0f},{m:.0f})" for s, m in curve[::tenth]))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
