"""Wall time of a night with the local and the Ray executor, for 1, 4 and 16 synthetic entries, as ratios.

    .venv/bin/python benchmarks/nightly_executors.py [--sizes 1 4 16] [--num-cpus N] [--json]

A synthetic entry is the bundled FCN head (models/fcn_head.toml, a small Conv/Deconvolution network built
in code) with small counts (3 calibration photographs, 2 evaluation photographs), named ``synthetic-NNN``:
each runs the whole entry (pipeline, two dumped inferences, locate or its skip, gate, report). Every size
runs in a fresh runs folder (first night: no baseline). The local executor runs the entries one after
another in this process; the Ray executor runs them as Ray tasks (1 CPU each) on a local Ray started once
(its start-up is timed apart and also added in a second ratio). Ratios are Ray / local (below 1: Ray faster).

    .venv/bin/python benchmarks/nightly_executors.py --order [--rounds 3] [--num-cpus 2] [--json]

``--order``: the hand-out order on Ray instead (``qconsist.nightly.order``). A night of real entries of different
lengths (``ORDER_ENTRIES``: two FCN heads, short, listed first; open_nsfw MinMax, long, listed last), each
``cpus = 1`` so that two run at once on a local Ray of 2 CPUs, in one runs folder and history: a first night
records each entry's seconds, then nights handed out in the file's order and longest first alternate, ``--rounds``
pairs. Printed: each night's wall time, the ratio longest first / file order of each pair and their median, and
what list scheduling of the durations the history held before each night predicts for either order (the LPT
bound: ``qconsist.nightly.order.list_schedule``).
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

from qconsist.history import History  # noqa: E402
from qconsist.nightly import ExecutorOptions, Order, load_nightly, run_nightly  # noqa: E402
from qconsist.nightly.order import list_schedule  # noqa: E402

# (name, bundled entry, calibration count, evaluation count): short entries first, the long one last: the file's
# order hands the long one out last, when a CPU frees up
ORDER_ENTRIES = [("short-fcn", "fcn_head", 12, 9), ("short-fcn-determinized", "fcn_head-determinized", 12, 9),
                 ("long-open_nsfw", "open_nsfw-minmax", 12, 9)]


def synthetic_nightly(folder: Path, entries: int) -> Path:
    template = derived_nightly(folder, ["fcn_head"]).read_text()
    head, _, entry = template.partition("[[models]]\n")
    text = head + "".join("[[models]]\n" + entry.replace('name = "fcn_head"', f'name = "synthetic-{i:03d}"') for i in range(entries))
    path = folder / "nightly.toml"
    path.write_text(text)
    return path


def order_nightly(folder: Path) -> Path:
    """``ORDER_ENTRIES`` as one nightly file (the bundled entries, renamed, with their counts, ``cpus = 1``)."""
    texts = []
    for name, bundled, calibration, evaluation in ORDER_ENTRIES:
        sub = folder / name
        sub.mkdir()
        text = derived_nightly(sub, [bundled]).read_text()
        head, _, entry = text.partition("[[models]]\n")
        entry = entry.replace(f'name = "{bundled}"\n', f'name = "{name}"\ncpus = 1\n')
        calibration_at = entry.index("[models.set.calibration]")
        evaluation_at = entry.index("[models.set.evaluation]")
        entry = (entry[:calibration_at] + entry[calibration_at:evaluation_at].replace("count = 3", f"count = {calibration}")
                 + entry[evaluation_at:].replace("count = 2", f"count = {evaluation}"))
        texts.append("[[models]]\n" + entry)
    path = folder / "nightly.toml"
    path.write_text(head + "".join(texts))
    return path


def order_rounds(rounds: int, slots: int) -> dict:
    """A first night, then ``rounds`` pairs (file order, longest first) on Ray in one runs folder and history."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = order_nightly(Path(folder))
        config = load_nightly(path)
        first = run_nightly(config, executor=ExecutorOptions("ray"), order=Order.FILE)
        names = [e.model for e in first.entries]
        for index in range(rounds):
            for order in (Order.FILE, Order.LONGEST_FIRST) if index % 2 == 0 else (Order.LONGEST_FIRST, Order.FILE):
                history = History(config.history, read_only=True)
                known = {name: history.last_seconds(name) for name in names}
                lengths = [known[name] or 0.0 for name in names]
                start = time.perf_counter()
                result = run_nightly(config, executor=ExecutorOptions("ray"), order=order)
                wall = time.perf_counter() - start
                if not result.passed:
                    raise SystemExit(f"a night failed: {result.summary()}")
                rows.append({"round": index + 1, "order": order.value, "wall_s": round(wall, 2), "night_s": round(result.seconds, 2),
                             "handed_out": result.handout.order if result.handout else names,
                             "entries_s": {e.model: round(e.seconds, 2) for e in result.entries},
                             "predicted_file_s": round(list_schedule(lengths, slots), 2),
                             "predicted_longest_first_s": round(list_schedule(sorted(lengths, reverse=True), slots), 2)})
    ratios = []
    for index in range(rounds):
        pair = {r["order"]: r["night_s"] for r in rows if r["round"] == index + 1}
        ratios.append(round(pair["longest-first"] / pair["file"], 3))
    return {"first_night_s": {e.model: round(e.seconds, 2) for e in first.entries}, "rows": rows, "ratios": ratios,
            "median_ratio": sorted(ratios)[len(ratios) // 2]}


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
    parser.add_argument("--order", action="store_true", help="compare the hand-out orders on Ray instead (see above)")
    parser.add_argument("--rounds", type=int, default=3, help="--order: pairs of nights (file order, longest first)")
    args = parser.parse_args()
    import ray

    if args.order:
        slots = args.num_cpus or 2
        ray.init(num_cpus=slots, include_dashboard=False, configure_logging=False, log_to_driver=False,
                 object_store_memory=256 * 2**20)
        try:
            found = order_rounds(args.rounds, slots)
        finally:
            ray.shutdown()
        if args.json:
            print(json.dumps({"cpus": slots, **found}, indent=2))
            return
        print(f"first night (file order), each entry's own seconds: {found['first_night_s']}")
        print("| round | order | night s | predicted s (from the history) | entries s |")
        print("| --- | --- | --- | --- | --- |")
        for row in found["rows"]:
            predicted = row["predicted_longest_first_s"] if row["order"] == "longest-first" else row["predicted_file_s"]
            print(f"| {row['round']} | {row['order']} | {row['night_s']} | {predicted} | {row['entries_s']} |")
        print(f"longest first / file order, each pair: {found['ratios']}; median {found['median_ratio']}")
        return

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
