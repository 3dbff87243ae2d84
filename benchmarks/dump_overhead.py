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
- where the fingerprints' CPU goes, on freshly written tensors as the dump's worker meets them: the hash of every
  column, the same again (caches warm where a tensor fits), the statistics, a whole row (``RowWork``), as CPU ms per
  sample and GB/s;
- where exposure's cost goes, by onnxruntime's own profiler (``enable_profiling``): the optimized graph reloaded with
  nothing exposed against the exposed session writing into the bound buffers, kernel time per operator type and per
  node, and the time of a run outside its kernels, per run;
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
    fingerprint_parts(plan, bound, feeds)
    exposure_by_op(plan, feeds, repeats)
    bound_ratio = np.median(times["exposed, outputs bound (as the dump runs it)"]) / plain
    full_ratio = np.median(times["full dump (dump.ms_per_sample of run --dump)"]) / plain
    print(f"  the floor, as ratios to production: exposed and bound {bound_ratio:.2f}, full dump {full_ratio:.2f}; "
          f"full dump faithful {faithful.faithful} in {faithful.samples} samples")


def fingerprint_parts(plan, bound, feeds) -> None:
    """CPU ms per sample of the fingerprints' parts on tensors the exposed session has just written (cold, as the
    worker meets them): every column's hash, the same again, the statistics, a whole row; each as GB/s of CPU."""
    from qconsist.inference import kernels
    from qconsist.inference.fingerprint import RowWork, ShapeTable

    parts: dict[str, list[float]] = {"hash, fresh tensors": [], "hash again": [], "statistics": [], "a row (RowWork: both, bookkeeping)": []}
    shapes = ShapeTable()
    nbytes = 0
    for feed in feeds:
        held = bound.run(feed)
        nbytes = sum(a.nbytes for a in held)
        used = time.process_time()
        for array in held[::-1]:  # last to first, as RowWork takes them
            kernels.mix64(array)
        parts["hash, fresh tensors"].append(time.process_time() - used)
        used = time.process_time()
        for array in held[::-1]:
            kernels.mix64(array)
        parts["hash again"].append(time.process_time() - used)
        used = time.process_time()
        for array in held[::-1]:
            kernels.statistics(array)
        parts["statistics"].append(time.process_time() - used)
        held = bound.run(feed)
        used = time.process_time()
        RowWork(held, shapes, None, plan.forms(held)).row()  # no previous row: every column's statistics
        parts["a row (RowWork: both, bookkeeping)"].append(time.process_time() - used)
    print(f"fingerprints' CPU per sample, {nbytes / 1e6:.1f} MB of freshly written tensors (load {load()}):")
    for label, values in parts.items():
        ms = 1000 * float(np.median(values))
        print(f"  {label:40s} CPU ms {ms:6.2f}  ({nbytes / ms / 1e6:.1f} GB/s)")


def exposure_by_op(plan, feeds, repeats: int) -> None:
    """onnxruntime's profiler on the optimized graph reloaded with nothing exposed and on the exposed session
    writing into bound buffers (``host_binding``), alternating passes: kernel time per run by operator type, the
    nodes whose time grew most, and a run's time outside its kernels."""
    import json
    import re
    from collections import defaultdict

    import onnxruntime as ort

    from qconsist.inference.dump import expose_all
    from qconsist.inference.host_binding import HostBinding
    from qconsist.onnxfile import read_onnx

    names = [t.name for t in plan.tensors]
    exposed, _ = expose_all(read_onnx(plan.optimized_path, external_data=True))
    folder = plan.optimized_path.parent

    def profiled(source, prefix: str):
        so = ort.SessionOptions()  # as the dump reloads the graph: optimizations off, idle threads sleeping
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.enable_profiling = True
        so.profile_file_prefix = str(folder / prefix)
        return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])

    reloaded = profiled(str(plan.optimized_path), "reloaded")
    session = profiled(exposed.SerializeToString(), "exposed")
    bound = HostBinding(session, names, plan.dtypes)
    bound.run(feeds[0])
    for r in range(repeats):
        for run in ((lambda f: reloaded.run(None, f)), bound.run)[:: 1 if r % 2 == 0 else -1]:
            for feed in feeds:
                run(feed)
    found = {}
    for label, profiled_session in (("reloaded, nothing exposed", reloaded), ("exposed and bound", session)):
        events = json.loads(Path(profiled_session.end_profiling()).read_text())
        by_op: dict[str, float] = defaultdict(float)
        by_node: dict[str, float] = defaultdict(float)
        runs = [e["dur"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by_op[e["args"].get("op_name", "?")] += e["dur"]
                by_node[re.sub(r"_token_\d+$", "", e["name"][: -len("_kernel_time")])] += e["dur"]  # ORT numbers repeats
        count = len(runs)
        kernels_ms = sum(by_op.values()) / count / 1000
        found[label] = ({k: v / count / 1000 for k, v in by_op.items()}, {k: v / count / 1000 for k, v in by_node.items()})
        print(f"  onnxruntime's profile, {label}: {count} runs, a run {np.median(runs) / 1000:.2f} ms (median), its kernels "
              f"{kernels_ms:.2f} ms, outside them {np.mean(runs) / 1000 - kernels_ms:.2f} ms (means)")
    (ops_r, nodes_r), (ops_e, nodes_e) = found["reloaded, nothing exposed"], found["exposed and bound"]
    grown = sum(ops_e.values()) - sum(ops_r.values())
    print(f"  kernel ms per run by operator (reloaded -> exposed; the kernels grew {grown:.2f} ms):")
    for op in sorted(ops_e, key=lambda o: ops_r.get(o, 0.0) - ops_e[o])[:8]:
        print(f"    {op:22s} {ops_r.get(op, 0.0):7.2f} -> {ops_e[op]:7.2f}  ({ops_e[op] - ops_r.get(op, 0.0):+.2f})")
    increases = sorted(((nodes_e[n] - nodes_r.get(n, 0.0), n) for n in nodes_e), reverse=True)[:5]
    print("    nodes that grew most: " + ", ".join(f"{n} {d:+.2f}" for d, n in increases))


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
