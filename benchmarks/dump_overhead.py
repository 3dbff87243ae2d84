"""Dump overhead on a QDQ model (CPU, batch 1): plain inference vs the faithful fingerprint dump, side by side.

Usage: .venv/bin/python benchmarks/dump_overhead.py MODEL INPUTS.npy [SAMPLES] [REPEATS]

Environment: ``BENCH_EP=cuda`` runs the per-sample comparison on the CUDA execution provider (on a GPU
machine); ``BENCH_SESSIONS_ONLY=1`` skips the whole-run, CLI and memory parts.

MODEL is an .onnx file or a pipeline run directory (its quantize artifact); INPUTS.npy holds preprocessed
samples stacked on axis 0 (cycled to SAMPLES, default 32). One invocation measures, interleaving the
variants REPEATS times (default 3) so that machine load hits them alike:

- per sample: the production session; ORT's optimized graph reloaded as the dump reloads it with nothing
  exposed; the dump session alone (every tensor of that graph exposed), its outputs copied into new arrays by
  ``session.run`` and bound into reused buffers as the dump runs it (``host_binding``); the bound session plus
  fingerprints in one thread, and in two threads taking columns from the last (``fingerprint.RowWork``, as the
  dump's worker and its waiting thread do); the full dump as ``run --dump`` runs a step (``recording.HostDump``
  around production; its figure is the recorder's time, ``dump.ms_per_sample``); each as a ratio to production,
  and the floor in one line: production, exposed and bound, the full dump;
- whole ``run_inference`` with and without ``--dump`` (the dump's run includes the production run, whose
  outputs are the inference result, and the faithfulness check of every sample), with the fingerprint
  worker thread on and off;
- whole ``qconsist run`` commands (new processes) with and without ``--dump``;
- peak RSS of ``qconsist run --dump`` for 8 and 64 samples, and bytes stored per tensor per sample.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
QCONSIST = str(Path(sys.executable).parent / "qconsist")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def stacked(inputs: Path, count: int, folder: Path) -> Path:
    base = np.load(inputs)
    path = folder / f"inputs-{count}.npy"
    np.save(path, base[np.arange(count) % len(base)])
    return path


def per_sample(fn, feeds) -> float:
    for feed in feeds[:2]:
        fn(feed)
    start = time.perf_counter()
    for feed in feeds:
        fn(feed)
    return 1000 * (time.perf_counter() - start) / len(feeds)


def spread(values: list[float]) -> str:
    return f"median {np.median(values):7.2f}  (" + " ".join(f"{v:.2f}" for v in values) + ")"


def sessions(model: Path, inputs: Path, folder: Path, repeats: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from qconsist.inference import ExecutionOptions, kernels, resolve_model
    from qconsist.inference.dump import plan_dump
    from qconsist.inference.fingerprint import RowWork, ShapeTable
    from qconsist.inference.host_binding import HostBinding
    from qconsist.inference.recording import HostDump
    from qconsist.inference.session import OptimizationLevel, create_session, input_specs

    source = resolve_model(model)
    options = ExecutionOptions(os.environ.get("BENCH_EP", "cpu"))
    production = create_session(source.path, options)
    beside = create_session(source.path, options, spinning=False)  # production beside a CPU dump (runner._sessions)
    plan = plan_dump(source.path, options, folder / "plan")
    # ORT's optimized graph reloaded as the dump reloads it (optimizations off, threads sleeping), nothing exposed
    reloaded = create_session(plan.optimized_path, options, level=OptimizationLevel.DISABLE, spinning=False)
    names = [t.name for t in plan.tensors]
    name = input_specs(source.path)[0].name
    feeds = [{name: np.ascontiguousarray(row[None])} for row in np.load(inputs)]
    bound = HostBinding(plan.session, names, plan.dtypes)
    kernels.prepare(plan.dtypes)  # numba's first calls: start-up, as a dump makes them
    arrays = plan.session.run(names, feeds[0])
    bound.run(feeds[0])
    print(f"model {source.path}: {len(names)} dumped tensors ({len(plan.converted)} put in another form: NCHWc blocks, "
          f"axis order), {sum(a.nbytes for a in arrays) / 1e6:.1f} MB per sample")
    shapes, last = ShapeTable(), [None]

    def fingerprinted(feed):
        held = bound.run(feed)
        last[0] = RowWork(held, shapes, last[0], plan.forms(held)).row()  # as fingerprint_row, forms made here

    helper = ThreadPoolExecutor(1)

    def two_threads(feed):
        held = bound.run(feed)
        work = RowWork(held, shapes, last[0], plan.forms(held))
        helper.submit(work.work)
        last[0] = work.row()

    # the whole dump as `qconsist run --dump` runs a step: the recorder's before (the exposed session, then waiting for
    # the worker's previous step), production, the recorder's after (the step handed to the worker); the dump's
    # figure is the recorder's time, as `run --dump` reports it (`dump.ms_per_sample`)
    recorder = HostDump(plan, options, folder / "full", 2 + repeats * len(feeds), set(), {}, None)
    steps = [0]
    steps_ms: list[float] = []  # per full-dump pass: the whole step (the dump and production beside it)

    def full_dump(feed_list) -> float:
        seconds, begun = recorder.seconds, time.perf_counter()
        for feed in feed_list:
            recorder.before(feed, 1)
            produced = beside.run(None, feed)
            recorder.after(steps[0], produced, 1)
            steps[0] += 1
        recorder._timed(recorder.recorder.wait)  # the last step's fingerprints belong to this pass
        steps_ms.append(1000 * (time.perf_counter() - begun) / len(feed_list))
        return 1000 * (recorder.seconds - seconds) / len(feed_list)

    full_dump(feeds[:2])  # warm: the buffers bound and the kernels loaded at the first steps
    steps_ms.clear()
    times: dict[str, list[float]] = {
        "production": [], "optimized graph reloaded, nothing exposed": [], "exposed, outputs copied (session.run)": [],
        "exposed, outputs bound (as the dump runs it)": [], "bound + fingerprints, one thread": [],
        "bound + fingerprints, two threads": [], "full dump (dump.ms_per_sample of run --dump)": [],
    }
    cpu: dict[str, list[float]] = {label: [] for label in times}  # the process's CPU time per sample (every thread)
    for r in range(repeats):
        order = list(times) if r % 2 == 0 else list(times)[::-1]
        for label in order:
            used = time.process_time()
            if label == "production":
                times[label].append(per_sample(lambda f: production.run(None, f), feeds))
            elif label.startswith("optimized"):
                times[label].append(per_sample(lambda f: reloaded.run(None, f), feeds))
            elif "copied" in label:
                times[label].append(per_sample(lambda f: plan.session.run(names, f), feeds))
            elif "as the dump runs it" in label:
                times[label].append(per_sample(bound.run, feeds))
            elif "one thread" in label:
                times[label].append(per_sample(fingerprinted, feeds))
            elif "two threads" in label:
                times[label].append(per_sample(two_threads, feeds))
            else:
                times[label].append(full_dump(feeds))
            warm = 0 if label.startswith("full") else 2  # per_sample's two warm calls
            cpu[label].append(1000 * (time.process_time() - used) / (len(feeds) + warm))
    helper.shutdown()
    recorder.finish(steps[0], lambda sample: 1)
    recorder.close()
    faithful = recorder.recorder.check
    plain = float(np.median(times["production"]))
    print(f"per sample, {repeats} interleaved passes of {len(feeds)} samples (load {load()}); ratio: median over production's median")
    times["full dump's step (dump + production beside)"] = steps_ms
    cpu["full dump's step (dump + production beside)"] = cpu["full dump (dump.ms_per_sample of run --dump)"]
    plain_cpu = float(np.median(cpu["production"]))
    for label, values in times.items():
        used = "  CPU: the step's" if label.startswith("full dump (") else \
            f"  CPU ms/sample {np.median(cpu[label]):6.2f} ({np.median(cpu[label]) / plain_cpu:.2f})"
        print(f"  {label:45s} ms/sample {spread(values)}  ratio {np.median(values) / plain:.2f}{used}")
    bound_ratio = np.median(times["exposed, outputs bound (as the dump runs it)"]) / plain
    full_ratio = np.median(times["full dump (dump.ms_per_sample of run --dump)"]) / plain
    print(f"  the floor, as ratios to production: exposed and bound {bound_ratio:.2f}, full dump {full_ratio:.2f}; "
          f"full dump faithful {faithful.faithful} in {faithful.samples} samples")


def whole_runs(model: Path, inputs: Path, folder: Path, repeats: int) -> None:
    from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
    from qconsist.inference import dump as dump_module
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set

    source = resolve_model(model)
    samples = open_input_set(inputs, None, input_specs(source.path)[0].name)
    walls: dict[str, list[float]] = {"run": [], "run --dump": [], "run --dump, no worker thread": []}
    faithful = []
    production: dict[str, list[float]] = {label: [] for label in walls}
    for r in range(repeats):
        for label in walls:
            dump_module.OVERLAP = label != "run --dump, no worker thread"
            start = time.perf_counter()
            result = run_inference(source, samples, RunRequest(ExecutionOptions(), dump="dump" in label), folder / "runs")
            walls[label].append(time.perf_counter() - start)
            production[label].append(result.ms_per_sample)
            if result.dump:
                faithful.append((result.dump.faithful, result.dump.samples_checked))
    dump_module.OVERLAP = True
    plain = float(np.median(walls["run"]))
    print(f"whole run_inference, {len(samples)} samples (includes session creation and ORT's graph save):")
    for label, values in walls.items():
        print(f"  {label:30s} s {spread(values)}  ratio {np.median(values) / plain:.2f}")
    for label, values in production.items():
        print(f"  production ms/sample recorded by {label:30s} {spread(values)}")
    print(f"  faithful (verdict, samples checked) per dump run: {sorted(set(faithful))}")


def cli_runs(model: Path, inputs: Path, folder: Path, repeats: int) -> None:
    walls: dict[str, list[float]] = {"qconsist run": [], "qconsist run --dump": []}
    for r in range(repeats):
        for label in walls:
            command = [QCONSIST, "run", str(model), "--inputs", str(inputs), "--runs-dir", str(folder / "cli"), "--json"]
            start = time.perf_counter()
            subprocess.run(command + (["--dump"] if "dump" in label else []), check=True, capture_output=True)
            walls[label].append(time.perf_counter() - start)
    plain = float(np.median(walls["qconsist run"]))
    print("whole commands (new processes, imports included):")
    for label, values in walls.items():
        print(f"  {label:30s} s {spread(values)}  ratio {np.median(values) / plain:.2f}")


def child_peak(model: str, inputs: str, runs: str) -> None:
    from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set

    source = resolve_model(model)
    samples = open_input_set(inputs, None, input_specs(source.path)[0].name)
    result = run_inference(source, samples, RunRequest(ExecutionOptions(), dump=True), Path(runs))
    size = sum(p.stat().st_size for p in (result.run_dir / "dump" / "table").iterdir())
    per = size / (result.samples * result.dump.tensors)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  {result.samples:3d} samples: peak RSS {peak:.0f} MB; fingerprint table {size} bytes = {per:.1f} bytes per tensor "
          f"per sample (header included); faithful {result.dump.faithful} in {result.dump.samples_checked} samples")


def main() -> None:
    if sys.argv[1] == "--child-peak":
        child_peak(*sys.argv[2:5])
        return
    model, inputs = Path(sys.argv[1]), Path(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    print(f"load average at start: {load()}")
    with tempfile.TemporaryDirectory(prefix="qconsist-bench-") as tmp:
        folder = Path(tmp)
        many = stacked(inputs, count, folder)
        sessions(model, many, folder, repeats)
        if os.environ.get("BENCH_SESSIONS_ONLY"):
            return
        whole_runs(model, many, folder, repeats)
        cli_runs(model, many, folder, repeats)
        print("memory of `run --dump` (separate processes):")
        for n in (8, 64):
            subprocess.run([sys.executable, __file__, "--child-peak", str(model), str(stacked(inputs, n, folder)), str(folder / "peak")], check=True)
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    main()
