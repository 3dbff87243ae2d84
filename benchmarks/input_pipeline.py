"""An ImageNet-size evaluation, side by side in one run: decoding, inference, and `qconsist run` with and without
a dump, on a labelled folder of JPEGs this script generates (no download).

    python benchmarks/input_pipeline.py [--count 1000] [--folder DIR] [--classes 1000] [--model tiny|MODEL]
        [--ep cpu|cuda] [--batch-size 32] [--workers N] [--fingerprints host|device] [--dynamic-batch]
        [--second batch=1|model=PATH|fingerprints=host] [--skip threads,dump,diff] [--generate-only] [--pageable]

**The folder** (``--folder``, default ``qconsist-imagenet-<count>`` in the system's temporary folder; made once,
kept): ``--count`` JPEGs of
``--size`` (500x375, ImageNet validation's usual size) at quality 90 in ``--classes`` (1,000) class folders,
``n00000000`` … — sample ``i`` is a seeded random crop (half to all of each side) of bundled photograph
``i mod 21``, flipped or not, resized; made by ``--workers`` processes.

**The steps**, each timed from a fresh start (the run steps are `qconsist` processes, the others run here):

* ``start-up``: `qconsist run` of one sample (everything but the per-sample work);
* ``decode, 1 process``: every file decoded and prepared in this process (open_nsfw's preprocessing);
* ``decode, N threads``: the same by N threads of one process (for the choice of processes, not used by qconsist);
* ``decode, N workers``: the input pipeline as `qconsist run` reads it (``InputSet.steps``, N worker processes);
* ``inference``: the model on pre-decoded tensors (a pool of steps, cycled), the session only; on the CUDA EP the
  pool lies in a ring of step buffers in ``/dev/shm`` page-locked as `qconsist run` page-locks its input workers'
  ring (``qconsist.inference.pinned``), so that it measures the GPU side's limit as the run feeds it (a line says
  so; ``--pageable``: private pageable arrays, as before);
* ``run``: `qconsist run MODEL --inputs FOLDER --pipeline pipelines/open_nsfw.toml --workers N --batch-size B`
  (with ``-v``: the summary ends with where its main thread spent the steps — waiting for inputs, the session,
  the recorder, the outputs, the progress);
* ``run --dump``: the same with ``--dump --fingerprints host|device``;
* ``run, 1/10 of the samples``: the plain run on the first tenth (its peak memory against the whole run's: flat);
* ``run --dump, second``: the dump again with one thing changed (``--second``: ``batch=1``, another batch size;
  ``model=PATH``, another model — the CUDA-calibrated open_nsfw against the CPU-calibrated one; ``fingerprints=host``);
* ``diff of the two dumps``: `qconsist diff --json` of the two dumps; the printout ends with its accuracy line —
  both runs' top-1 (and top-5) against the folders' labels, the predictions that flipped and their origin — and
  the first flipped samples.

For each: wall time, CPU time (this process and its ended children: steadier than the wall clock on a shared
machine), samples per second, peak resident memory (the process and its workers, sampled every 0.2 s),
and for runs the disk and files of the run directory (removed at the end). ``--model tiny`` (the default) is a
224x224 classifier built here (open_nsfw's outputs: 2 classes) whose inference costs next to nothing, so that
``run`` measures qconsist's own path; on the GPU machine give the open_nsfw QDQ model (a run directory or its
``quantize/model.onnx``). The folders' labels must be the model's: with ``--classes 2`` open_nsfw's two classes are
the first two folders; with 1,000 folders (the pure-throughput measurement) the run records no accuracy (its
labels go past the model's classes, which it says) and the diff compares the runs' predictions all the same.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PIPELINE = REPO / "pipelines" / "open_nsfw.toml"
# the command as the `qconsist` script runs it (qconsist.__main__: the interrupt guard, the exit at the last atexit
# callback); until this stop `-c "from qconsist.cli import main; main()"`, whose exit ran Python's whole teardown
QCONSIST = [sys.executable, "-m", "qconsist"]


# --- progress -------------------------------------------------------------------------------------------------


@contextmanager
def progress(description: str, total: int):
    """A bar with throughput and ETA on a terminal (rich, as the CLI draws it), a line every 10% elsewhere."""
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), transient=True) as bar:
            task = bar.add_task(description, total=total, rate="")
            start = time.perf_counter()

            def advance(n: int = 1) -> None:
                bar.advance(task, n)
                done = bar.tasks[0].completed
                bar.update(task, rate=f"{done / max(time.perf_counter() - start, 1e-9):.0f}/s")

            yield advance
        return
    start, done, marks = time.perf_counter(), [0], [0]

    def advance(n: int = 1) -> None:
        done[0] += n
        if done[0] * 10 // total > marks[0]:
            marks[0] = done[0] * 10 // total
            spent = time.perf_counter() - start
            print(f"  {description}: {done[0]}/{total}, {done[0] / spent:.0f}/s, ETA {spent / done[0] * (total - done[0]):.0f} s",
                  file=sys.stderr, flush=True)

    yield advance


# --- CPU time -------------------------------------------------------------------------------------------------


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (input workers, `qconsist` processes with
    their own workers): steadier than the wall clock on a machine shared with other work."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# --- memory ---------------------------------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as handle:
                    parents[int(entry.name)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [pid], {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier}
        found += frontier
    return found


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class PeakMemory(threading.Thread):
    """The largest resident memory of a process and of it with its descendants, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.main, self.tree = pid, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.sample()

    def sample(self) -> None:
        self.main = max(self.main, _rss(self.pid))
        self.tree = max(self.tree, sum(_rss(p) for p in _tree(self.pid)))

    def __enter__(self) -> "PeakMemory":
        self.sample()
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join()


# --- the folder -----------------------------------------------------------------------------------------------


def _make_one(args: tuple) -> None:
    from PIL import Image

    from qconsist.inputs.photos import package_photos

    folder, index, classes, size, seed = args
    photos = package_photos()
    rng = np.random.default_rng((seed, index))
    with Image.open(photos[index % len(photos)]) as image:
        image = image.convert("RGB")
        width, height = image.size
        w, h = (max(1, int(side * rng.uniform(0.5, 1.0))) for side in (width, height))
        left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
        image = image.crop((left, top, left + w, top + h)).resize(size, Image.Resampling.BILINEAR)
        if rng.integers(0, 2):
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        path = folder / f"n{index % classes:08d}" / f"val_{index:08d}.JPEG"
        image.save(path, quality=90)


def generate(folder: Path, count: int, classes: int, size: tuple[int, int], workers: int, seed: int = 0) -> float:
    """The labelled folder (kept between runs: a marker names what it holds); seconds spent making it."""
    marker = folder / ".made.json"
    wanted = {"count": count, "classes": classes, "size": list(size), "seed": seed, "quality": 90}
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return 0.0
    shutil.rmtree(folder, ignore_errors=True)
    for c in range(min(classes, count)):
        (folder / f"n{c:08d}").mkdir(parents=True)
    start = time.perf_counter()
    with progress(f"generating {count} JPEGs", count) as advance, ProcessPoolExecutor(workers) as pool:
        for _ in pool.map(_make_one, [(folder, i, classes, size, seed) for i in range(count)], chunksize=64):
            advance()
    marker.write_text(json.dumps(wanted))
    return time.perf_counter() - start


# --- the steps ------------------------------------------------------------------------------------------------


def _tiny_model(path: Path) -> Path:
    """A 224x224 classifier costing next to nothing: a stride-8 convolution, global pooling and open_nsfw's two
    class scores (a 1,000-class softmax spans more binary orders than a numpy fingerprint repeats exactly, so
    its first run in a process imports numba: about 1.2 s here, ``kernels.NUMPY_BUDGET``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["data", "w"], ["c"], strides=[8, 8], kernel_shape=[8, 8]),
         helper.make_node("GlobalAveragePool", ["c"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
         helper.make_node("Gemm", ["f", "fc"], ["logits"], transB=1), helper.make_node("Softmax", ["logits"], ["prob"], axis=1)],
        "tiny", [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["n", 3, 224, 224])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["n", 2])],
        [numpy_helper.from_array(rng.normal(0, 0.01, (8, 3, 8, 8)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(0, 0.1, (2, 8)).astype(np.float32), "fc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _inputs(folder: Path, workers: int | None, name: str = "data"):
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline

    return open_input_set(folder, load_pipeline(PIPELINE).preprocess, name).with_workers(workers)


def decode(folder: Path, count: int, batch: int, workers: int, label: str) -> dict:
    """The first ``count`` samples through the input pipeline, as `qconsist run` reads them."""
    inputs = _inputs(folder, workers)
    inputs = inputs.subset(0, count) if count < len(inputs) else inputs
    with PeakMemory(os.getpid()) as memory, progress(label, count) as advance:
        start, cpu = time.perf_counter(), cpu_seconds()
        for step in inputs.steps(batch, borrowed=True):
            advance(len(step.infos))
        wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    return {"wall": wall, "cpu": cpu, "rss": memory.tree}


def decode_threads(folder: Path, count: int, threads: int) -> dict:
    """The same work by ``threads`` threads of this process (each sample as a worker makes it)."""
    from qconsist.inputs.stream import prepare_sample

    inputs = _inputs(folder, 0).subset(0, count)
    with PeakMemory(os.getpid()) as memory, progress(f"decode, {threads} threads", count) as advance, \
            ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        for _ in pool.map(lambda i: prepare_sample(inputs._load, i), range(count)):
            advance()
        wall = time.perf_counter() - start
    return {"wall": wall, "rss": memory.tree}


def _page_locked(pool: list[dict], options) -> tuple[object | None, list[dict], str]:
    """``pool`` copied into a ring of step buffers (the input workers' ``stream._Ring``, a ``/dev/shm`` mapping)
    page-locked as `qconsist run` page-locks its workers' ring (``pinned.page_lock``), the ring, and a line saying
    what was done; pageable (the pool as it was, and why) where the registration cannot be made."""
    import numpy as np

    from qconsist.inference.pinned import cuda_runtime, page_lock
    from qconsist.inputs.stream import _Ring, _views

    layout = [(name, tuple(a.shape[1:]), a.dtype) for name, a in pool[0].items()]
    rows = len(next(iter(pool[0].values())))
    slot = rows * sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, shape, dtype in layout)
    try:
        runtime = cuda_runtime()
    except Exception as exc:  # noqa: BLE001 - CuPy missing: measured pageable, said
        return None, pool, f"pageable: CuPy is not available ({exc})"
    ring = _Ring(len(pool), slot)
    ring.unlink()
    views = []
    for i, step in enumerate(pool):
        if len(next(iter(step.values()))) != rows:
            break  # a shorter last step (count < 8 steps) stays out of the pool
        view = _views(ring.map, i * slot, layout, rows)
        for name, array in step.items():
            view[name][...] = array
        views.append(view)
    memory = page_lock(ring, runtime, int(options.option("device_id") or 0), options)
    if not memory.page_locked:
        return ring, pool, f"pageable: {memory.note}"
    return ring, views, (f"page-locked: its {len(views)} steps in a /dev/shm ring of {memory.bytes / 2**20:.1f} MiB "
                         "registered as `qconsist run` registers its input workers' ring")


def inference(model: Path, folder: Path, count: int, batch: int, options, dynamic: bool, pageable: bool = False) -> dict:
    """The session alone on pre-decoded tensors: a pool of up to 8 steps, cycled ``count / batch`` times; on the
    CUDA EP in page-locked memory as `qconsist run` feeds it (``_page_locked``) unless ``pageable``."""
    from qconsist.inference.pinned import PROVIDERS
    from qconsist.inference.session import create_session

    if dynamic:
        import onnx

        from qconsist.inference.model import with_dynamic_batch

        restamped = Path(tempfile.mkdtemp(prefix="qconsist-bench-")) / "model.onnx"
        onnx.save(with_dynamic_batch(onnx.load(str(model))), str(restamped))
        model = restamped
    session = create_session(model, options)
    name = session.get_inputs()[0].name  # the model's own (open_nsfw's QDQ model: data_input)
    pool = [step.arrays for _, step in zip(range(8), _inputs(folder, 0, name).steps(batch))]
    ring, feeding = None, "pageable: private arrays (--pageable)" if pageable else f"pageable: {options.provider.upper()} EP"
    if options.provider in PROVIDERS and not pageable:
        ring, pool, feeding = _page_locked(pool, options)
    print(f"inference, pre-decoded: {feeding}", file=sys.stderr, flush=True)
    session.run(None, pool[0])  # warm: cuDNN picks its algorithms
    steps = -(-count // batch)
    with PeakMemory(os.getpid()) as memory, progress("inference", count) as advance:
        start, cpu = time.perf_counter(), cpu_seconds()
        for n in range(steps):
            session.run(None, pool[n % len(pool)])
            advance(min(batch, count - n * batch))
        wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    if ring is not None:
        ring.close()  # unregistered before it is unmapped
    return {"wall": wall, "cpu": cpu, "rss": memory.tree, "feeding": feeding}


def run(args: list[str], runs: Path, run_id: str, count: int, keep: bool = False) -> dict:
    """One `qconsist run` (its progress on this terminal); wall, peak memory, disk and files of its run (removed
    unless ``keep``)."""
    command = [*QCONSIST, "-v", "run", *args, "--runs-dir", str(runs), "--run-id", run_id, "--json"]
    start, cpu = time.perf_counter(), cpu_seconds()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(process.pid) as memory:
        out, err = process.communicate()
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    spans = ["; ".join(line.split("qconsist.inference.runner: ", 1)[1] for line in err.splitlines()
                       if "qconsist.inference.runner: steps: " in line or "qconsist.inference.runner: start-up: " in line)]
    sys.stderr.write("".join(line + "\n" for line in err.splitlines() if not line.startswith("INFO ")))
    if process.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}")
    files = [p for p in (runs / run_id).rglob("*") if p.is_file()]
    result = {"wall": wall, "cpu": cpu, "rss": memory.tree, "rss_main": memory.main, "files": len(files),
              "disk": sum(p.stat().st_size for p in files), "json": json.loads(out), "spans": spans[-1] if spans else ""}
    if not keep:
        shutil.rmtree(runs / run_id)
    return result


def diff(run_a: Path, run_b: Path) -> dict:
    """`qconsist diff --json` of two runs: wall (start-up included), peak memory, the result."""
    command = [*QCONSIST, "diff", str(run_a), str(run_b), "--json"]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    with PeakMemory(process.pid) as memory:
        out, _ = process.communicate()
    if process.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}")
    return {"wall": time.perf_counter() - start, "rss": memory.tree, "json": json.loads(out)}


def second_args(spec: str, common: list[str], given: str) -> list[str]:
    """The dump run's arguments with the one change ``--second`` names."""
    key, _, value = spec.partition("=")
    args = list(common)
    if key == "batch":
        args[args.index("--batch-size") + 1] = value
    elif key == "model":
        args[0] = value
    elif key == "fingerprints":
        args += ["--fingerprints", value]
        return args
    else:
        raise SystemExit(f"--second {spec!r}: give batch=N, model=PATH or fingerprints=host|device")
    return args


def describe_diff(data: dict, limit: int = 12) -> list[str]:
    """The lines of a diff result the benchmark prints: tensors, outputs, accuracy and the first flips."""
    lines = []
    tensors = data.get("tensors") or {}
    if tensors:
        lines.append(f"tensors: {len(tensors.get('nodes') or [])} of {tensors.get('compared')} diverge; first "
                     f"{tensors.get('first')}; origins {', '.join(tensors.get('origins') or []) or 'none'}")
    outputs = data.get("outputs") or {}
    if outputs:
        lines.append(f"final outputs: {len(outputs.get('differing_samples') or [])}/{outputs.get('samples')} samples differ, "
                     f"greatest abs difference {outputs.get('greatest_abs'):.6g}")
    accuracy = data.get("accuracy")
    if accuracy:
        lines.append(accuracy["summary"])
        for flip in accuracy["flipped"][:limit]:
            label = f", label {flip['label']}" if flip.get("label") is not None else ""
            lines.append(f"  sample {flip['sample']} ({flip['name']}{label}): class {flip['class_a']} -> {flip['class_b']}; "
                         f"first diverging node {flip.get('first')}; origins {', '.join(flip.get('origins') or []) or 'none'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--folder", type=Path, help="where the JPEG folder is made (default: TMPDIR/qconsist-imagenet-COUNT)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--size", default="500x375", help="WIDTHxHEIGHT of the JPEGs")
    parser.add_argument("--model", default="tiny", help="tiny (built here), an .onnx model or a run directory")
    parser.add_argument("--ep", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, help="input workers (default: the cores available)")
    parser.add_argument("--fingerprints", default="host", choices=["host", "device"])
    parser.add_argument("--dynamic-batch", action="store_true", help="re-stamp a model with a fixed batch of 1")
    parser.add_argument("--generate-only", action="store_true", help="make the folder and stop")
    parser.add_argument("--pageable", action="store_true",
                        help="inference on pre-decoded tensors from private pageable arrays (default on the CUDA EP: "
                             "page-locked, as `qconsist run` feeds its session)")
    parser.add_argument("--skip", default="", help="steps to leave out, comma-separated: threads, dump, diff")
    parser.add_argument("--second", default="batch=1",
                        help="what the second dump changes: batch=N, model=PATH or fingerprints=host|device (default batch=1)")
    parser.add_argument("--single-limit", type=int, default=2000,
                        help="decode in 1 process and by N threads on at most this many samples, their time scaled "
                             "to --count (marked est.; default 2000)")
    options = parser.parse_args()

    from qconsist.inference.model import resolve_model
    from qconsist.inference.session import ExecutionOptions
    from qconsist.inputs.stream import available_cores

    workers = options.workers or available_cores()
    count, batch = options.count, options.batch_size
    folder = options.folder or Path(tempfile.gettempdir()) / f"qconsist-imagenet-{count}"
    made = generate(folder, count, options.classes, tuple(int(v) for v in options.size.split("x")), workers)
    if options.generate_only:
        print(f"{folder}: {count} JPEGs" + (f", made in {made:.0f} s" if made else " (already there)"))
        return
    scratch = Path(tempfile.mkdtemp(prefix="qconsist-bench-"))
    model = _tiny_model(scratch / "tiny.onnx") if options.model == "tiny" else resolve_model(options.model).path
    given = str(model) if options.model == "tiny" else options.model
    execution = ExecutionOptions(options.ep, {"cudnn_conv_algo_search": "HEURISTIC"} if options.ep == "cuda" else {})
    common = [given, "--inputs", str(folder), "--pipeline", str(PIPELINE), "--ep", options.ep, "--batch-size",
              str(batch), "--workers", str(workers), *(["--cudnn-conv-algo-search", "HEURISTIC"] if options.ep == "cuda" else []),
              *(["--dynamic-batch"] if options.dynamic_batch else [])]
    skip = set(filter(None, options.skip.split(",")))
    runs = scratch / "runs"
    rows: dict[str, dict] = {}
    rows["start-up (1 sample)"] = run([*common, "--count", "1"], runs, "startup", 1)
    limited = min(count, options.single_limit)
    scale = count / limited
    rows["decode, 1 process"] = decode(folder, limited, batch, 0, "decode, 1 process")
    if "threads" not in skip:
        rows[f"decode, {workers} threads"] = decode_threads(folder, limited, workers)
    for name in ("decode, 1 process", f"decode, {workers} threads"):
        if name in rows and scale != 1:
            rows[name] = {**rows[name], "wall": rows[name]["wall"] * scale, "estimated": f"est. from {limited}"}
    rows[f"decode, {workers} workers"] = decode(folder, count, batch, workers, f"decode, {workers} workers")
    rows["inference (pre-decoded)"] = inference(model, folder, count, batch, execution, options.dynamic_batch,
                                                options.pageable)
    rows["run"] = run(common, runs, "plain", count)
    tenth = max(1, count // 10)
    rows[f"run, 1/10 of the samples ({tenth})"] = {**run([*common, "--count", str(tenth)], runs, "tenth", tenth), "per": tenth}
    compared = None
    if "dump" not in skip:
        dumped = [*common, "--dump", "--fingerprints", options.fingerprints]
        rows[f"run --dump --fingerprints {options.fingerprints}"] = run(dumped, runs, "dump", count, keep=True)
        if "diff" not in skip:
            rows[f"run --dump, second ({options.second})"] = run(second_args(options.second, dumped, given), runs, "dump2",
                                                                 count, keep=True)
            compared = diff(runs / "dump", runs / "dump2")
            rows["diff of the two dumps"] = compared
    shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n{count} JPEGs of {options.size} in {min(count, options.classes)} class folders "
          f"({sum(p.stat().st_size for p in folder.rglob('*.JPEG')) / 1e6:.0f} MB{f', made in {made:.0f} s' if made else ''}); "
          f"model {options.model} on {options.ep}, batch {batch}, {workers} workers, {available_cores()} cores; "
          + ("PYTHONDONTWRITEBYTECODE=1: a module without cached bytecode is compiled at every start, by every run and "
             "every input worker (a worker's imports: 0.9 CPU s without, 0.2 s with)" if os.environ.get("PYTHONDONTWRITEBYTECODE")
             else "bytecode written and used"))
    print("| step | wall s | CPU s | samples/s | vs decode, 1 process | peak RSS MB (with workers) | run disk MB | run files |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    single = rows["decode, 1 process"]["wall"]
    for name, row in rows.items():
        per = row.get("per", count if name != "start-up (1 sample)" else 1)
        disk = f"{row['disk'] / 1e6:.1f}" if "disk" in row else ""
        cpu = f"{row['cpu']:.2f}" if "cpu" in row and "estimated" not in row else ""
        print(f"| {name}{' (' + row['estimated'] + ')' if 'estimated' in row else ''} | {row['wall']:.2f} | {cpu} | "
              f"{per / row['wall']:.0f} | {row['wall'] / single:.2f} | "
              f"{row['rss'] / 1e6:.0f} | {disk} | {row.get('files', '')} |")
    print(f"\ninference, pre-decoded: {rows['inference (pre-decoded)']['feeding']}", end="")
    startup = rows["start-up (1 sample)"]["wall"]
    body = rows["run"]["wall"] - startup
    if "estimated" not in rows["decode, 1 process"]:  # the same by CPU time, which other work on the machine moves less
        cpu_body = rows["run"]["cpu"] - rows["start-up (1 sample)"]["cpu"]
        print(f"\nby CPU time: run - start-up = {cpu_body:.2f} s = {cpu_body / rows['decode, 1 process']['cpu']:.2f} x decode "
              f"in 1 process (the run's worker processes' start included; a 1-sample run starts none)", end="")
    print(f"\nrun wall - start-up = {body:.2f} s = {body / single:.2f} x decode in 1 process (goal <= 0.8); "
          f"run / max(decode with workers, inference) = "
          f"{rows['run']['wall'] / max(rows[f'decode, {workers} workers']['wall'], rows['inference (pre-decoded)']['wall']):.2f} (GPU goal <= 1.2)")
    dump = rows.get(f"run --dump --fingerprints {options.fingerprints}")
    if dump:
        print(f"run --dump / run = {dump['wall'] / rows['run']['wall']:.2f} (GPU goal <= 1.3)")
    for name in ("run", f"run --dump --fingerprints {options.fingerprints}"):
        if rows.get(name, {}).get("spans"):  # `qconsist -v run`'s line: where its main thread spent the steps
            print(f"main thread of `{name}`: {rows[name]['spans']}")
    plain, tenth_row = rows["run"], rows[f"run, 1/10 of the samples ({tenth})"]
    print(f"peak RSS of the run: {plain['rss_main'] / 1e6:.0f} MB for {count} samples, {tenth_row['rss_main'] / 1e6:.0f} MB "
          f"for {tenth} (main process; goal: flat in the sample count); files per run: {plain['files']} plain"
          + (f", {dump['files']} with the dump" if dump else "") + " (goal <= 20)")
    if compared is not None:
        second = rows[f"run --dump, second ({options.second})"]
        both = dump["wall"] + second["wall"] + compared["wall"]
        print(f"two dumps + diff = {both:.1f} s (GPU goal < 180 s at 50,000); diff {compared['wall']:.1f} s (goal < 30 s), "
              f"peak RSS {compared['rss'] / 1e6:.0f} MB; disk of both dumps {(dump['disk'] + second['disk']) / 1e6:.0f} MB "
              "(goal <= 1,000 MB at 50,000)")
        accuracy = (dump["json"].get("accuracy") or {})
        if not accuracy:
            print("the runs recorded no accuracy: the folders' labels are not the model's (use --classes with the "
                  "model's class count)")
        print("\n".join(describe_diff(compared["json"])))
    shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
