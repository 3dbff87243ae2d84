"""Wall time of a night with the local and the Ray executor, for 1, 4 and 16 synthetic entries, as ratios.

    .venv/bin/python benchmarks/nightly_executors.py [--sizes 1 4 16] [--num-cpus N] [--json]

A synthetic entry is the bundled FCN head (models/fcn_head.toml, a small Conv/Deconvolution network built
in code) with small counts (3 calibration photographs, 2 evaluation photographs), named ``synthetic-NNN``:
each runs the whole entry (pipeline, two dumped inferences, locate or its skip, gate, report). Every size
runs in a fresh runs folder (first night: no baseline). The local executor runs the entries one after
another in this process; the Ray executor runs them as Ray tasks (1 CPU each) on a local Ray started once
(its start-up is timed apart and also added in a second ratio). Ratios are Ray / local (below 1: Ray faster).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from nightly_files import derived_nightly  # noqa: E402 - the test nightly files (bundled entries, small counts)

from qconsist.nightly import ExecutorOptions, load_nightly, run_nightly  # noqa: E402


def synthetic_nightly(folder: Path, entries: int) -> Path:
    template = derived_nightly(folder, ["fcn_head"]).read_text()
    head, _, entry = template.partition("[[models]]\n")
    text = head + "".join("[[models]]\n" + entry.replace('name = "fcn_head"', f'name = "synthetic-{i:03d}"') for i in range(entries))
    path = folder / "nightly.toml"
    path.write_text(text)
    return path


def night(path: Path, executor: ExecutorOptions) -> float:
    config = load_nightly(path)
    start = time.perf_counter()
    result = run_nightly(config, executor=executor)
    seconds = time.perf_counter() - start
    if not result.passed:
        raise SystemExit(f"a night failed: {result.summary()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import ray

    start = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, configure_logging=False, log_to_driver=False,
             object_store_memory=256 * 2**20)
    startup = time.perf_counter() - start
    rows = []
    try:
        for size in args.sizes:
            with tempfile.TemporaryDirectory() as local_dir, tempfile.TemporaryDirectory() as ray_dir:
                local = night(synthetic_nightly(Path(local_dir), size), ExecutorOptions("local"))
                on_ray = night(synthetic_nightly(Path(ray_dir), size), ExecutorOptions("ray"))
            rows.append({"entries": size, "local_s": round(local, 2), "ray_s": round(on_ray, 2),
                         "ratio": round(on_ray / local, 2), "ratio_with_startup": round((on_ray + startup) / local, 2)})
    finally:
        ray.shutdown()
    cpus = args.num_cpus or __import__("os").cpu_count()
    if args.json:
        print(json.dumps({"ray_startup_s": round(startup, 2), "cpus": cpus, "rows": rows}, indent=2))
        return
    print(f"local Ray start-up: {startup:.1f} s ({cpus} CPUs)")
    print("| entries | local s | Ray s | Ray / local | with start-up |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['entries']} | {row['local_s']} | {row['ray_s']} | {row['ratio']} | {row['ratio_with_startup']} |")


if __name__ == "__main__":
    main()
