"""``--contention``: another process keeps the GPU busy with changing work while the repeats run again.

cuDNN's EXHAUSTIVE search picks algorithms by timing them, and timings move when the GPU is shared; the
real case only reproduced in a job that loaded the GPU with several models. ``GpuLoad`` starts
``python -m qconsist.locate.contention`` in its own process. The worker runs convolutions of shapes that
change every iteration (batch, channels, spatial size, kernel size drawn from a seeded generator), through
PyTorch with cuDNN's own autotuner on when PyTorch with CUDA is importable, else through ONNX Runtime's
CUDA EP with small Conv models it builds. It prints ``ready <backend>`` after its first iteration and, when
stopped, ``done <iterations>``, so the report can say how much work competed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from qconsist.errors import UnavailableError
from qconsist.inference.session import ExecutionOptions, create_session
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

SHAPES_SEED = 20261121


@serialized
@dataclass(frozen=True)
class LoadSummary:
    backend: str
    iterations: int  # summed over the workers
    seconds: float
    pid: int  # the first worker's
    workers: int = 1


class GpuLoad:
    """Context manager: ``workers`` processes loading the GPU for the duration of the block, each with its
    own seed (several models sharing a GPU, as in the real case)."""

    def __init__(self, seed: int = SHAPES_SEED, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.seed = seed
        self.workers = workers
        self.summary: LoadSummary | None = None
        self._procs: list[subprocess.Popen] = []
        self._backend = ""
        self._start = 0.0

    def __enter__(self) -> "GpuLoad":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for index in range(self.workers):
            self._procs.append(subprocess.Popen(
                [sys.executable, "-m", "qconsist.locate.contention", "--seed", str(self.seed + index)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            ))
        for proc in self._procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()  # the worker prints "ready" or exits
            if not line.startswith("ready "):
                err = self._finish_error(proc)
                self._stop_all()
                raise UnavailableError(f"the GPU load worker did not start: {line or err or 'no output'}")
            self._backend = line.split(" ", 1)[1]
        self._start = time.monotonic()
        log.info("GPU load: %d worker(s) ready (%s)", len(self._procs), self._backend)
        return self

    @staticmethod
    def _finish_error(proc: subprocess.Popen) -> str:
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        lines = (err or "").strip().splitlines()
        return lines[-1] if lines else ""

    def _stop_all(self) -> list[tuple[str, str]]:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        outputs = []
        for proc in self._procs:
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            outputs.append((out or "", err or ""))
        return outputs

    def alive(self) -> bool:
        return bool(self._procs) and all(proc.poll() is None for proc in self._procs)

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        seconds = time.monotonic() - self._start
        total, failed = 0, ""
        for out, err in self._stop_all():
            done = [line for line in out.splitlines() if line.startswith("done ")]
            if done:
                total += int(done[-1].split()[1])
            elif not failed:
                failed = (err.strip().splitlines()[-1:] or ["no output"])[0]
        self.summary = LoadSummary(self._backend, total if not failed else -1, seconds, self._procs[0].pid, len(self._procs))
        if failed and exc is None:
            raise UnavailableError(f"the GPU load worker died during the contention phase: {failed}")


# ---------------------------------------------------------------------------------------------- worker


def _shapes(rng: np.random.Generator) -> tuple[int, int, int, int, int]:
    batch = int(rng.choice([1, 2, 4, 8, 16]))
    channels = int(rng.choice([16, 32, 64, 128, 256]))
    size = int(rng.choice([14, 28, 56, 112]))
    out = int(rng.choice([16, 64, 128, 256]))
    kernel = int(rng.choice([1, 3, 5]))
    return batch, channels, size, out, kernel


class _Stop:
    flag = False


def _torch_worker(rng: np.random.Generator) -> int:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    torch.backends.cudnn.benchmark = True  # cuDNN's own timing-based autotuner, shapes always new
    iterations = 0
    while not _Stop.flag:
        batch, channels, size, out, kernel = _shapes(rng)
        x = torch.randn(batch, channels, size, size, device="cuda")
        w = torch.randn(out, channels, kernel, kernel, device="cuda")
        for _ in range(4):
            x2 = torch.nn.functional.conv2d(x, w, padding=kernel // 2)
        torch.cuda.synchronize()
        del x2
        iterations += 1
        if iterations == 1:
            print("ready torch", flush=True)
    return iterations


def _conv_model(channels: int, out: int, kernel: int, rng: np.random.Generator) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    weight = rng.standard_normal((out, channels, kernel, kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[kernel // 2] * 4)
    graph = helper.make_graph(
        [node], "load", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", channels, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _ort_worker(rng: np.random.Generator) -> int:
    options = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "EXHAUSTIVE"})
    iterations = 0
    while not _Stop.flag:
        batch, channels, size, out, kernel = _shapes(rng)
        session = create_session(_conv_model(channels, out, kernel, rng), options)
        x = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
        for _ in range(4):
            session.run(None, {"x": x})
        iterations += 1
        if iterations == 1:
            print("ready onnxruntime", flush=True)
    return iterations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Keep the GPU busy with convolutions of changing shapes.")
    parser.add_argument("--seed", type=int, default=SHAPES_SEED)
    parser.add_argument("--backend", choices=("auto", "torch", "onnxruntime"), default="auto")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: setattr(_Stop, "flag", True))
    rng = np.random.default_rng(args.seed)
    backend = args.backend
    if backend == "auto":
        try:
            import torch

            backend = "torch" if torch.cuda.is_available() else "onnxruntime"
        except ImportError:
            backend = "onnxruntime"
    try:
        iterations = _torch_worker(rng) if backend == "torch" else _ort_worker(rng)
    except Exception as exc:  # noqa: BLE001 - the parent reports the worker's last line
        print(f"load worker failed: {exc}", file=sys.stderr, flush=True)
        return 3
    print(f"done {iterations}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
