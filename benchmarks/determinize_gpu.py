"""Original vs determinized ConvTranspose (and ScatterElements add) on an execution provider: how many
distinct outputs repeated runs give, and the median latency, side by side.

    .venv/bin/python benchmarks/determinize_gpu.py --ep cuda                  # on the GPU machine
    .venv/bin/python benchmarks/determinize_gpu.py --ep cpu --runs 3 --sessions 2 --geometries k4s2p1

For every geometry (``tests/onnx_builders.CONV_TRANSPOSE_GEOMETRIES`` at realistic channel counts:
64 -> 32 channels on 56x56 for stride 2, 21 -> 21 on 28x28 / 14x14 for strides 4 / 8), batch (1 and 8) and
``cudnn_conv_algo_search`` mode (CUDA only; the CPU has one row), both models run ``--runs`` times in each of
``--sessions`` fresh sessions on one seeded input. Columns: distinct outputs (distinct sha1 of the output
bytes) out of runs x sessions, median latency of a run in ms, and the greatest |rewritten - original| of
the first run. ``--deterministic-compute`` sets ``use_deterministic_compute``; ``--scatter`` adds a
ScatterElements(reduction=add) row (32 x 1024 updates into 32 x 128); ``--json FILE`` saves the rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from onnx_builders import CONV_TRANSPOSE_GEOMETRIES, conv_transpose_model, scatter_model  # noqa: E402

from qconsist.inference.session import ExecutionOptions, create_session  # noqa: E402
from qconsist.stages.determinize import DeterminizeOptions, determinize_model  # noqa: E402

DEFAULT_GEOMETRIES = ["k4s2p1", "k8s4p2", "k16s8p4", "k3s2p1 output_padding 1", "k4s2p0 + crop 1 (folded)", "no bias",
                      "non-square kernel and stride"]
SIZE_BY_STRIDE = {2: (56, 56), 3: (56, 56), 4: (28, 28), 8: (14, 14)}


def realistic(kwargs: dict, batch: int) -> dict:
    """The geometry at a segmentation network's channel counts and sizes."""
    stride = max(kwargs.get("strides", (2, 2)))
    channels = {"cin": 64, "cout": 32} if stride <= 3 else {"cin": 21, "cout": 21}
    out = {**kwargs, **channels, "size": SIZE_BY_STRIDE[stride], "batch": batch}
    if "crop" in kwargs:  # the crop removes 1 (stride 2) / 2 (stride 4) rows and columns on each side
        full = [stride * (n - 1) + k for n, k in zip(out["size"], kwargs.get("kernel", (4, 4)))]
        cut = kwargs["crop"][0][0]
        out["crop"] = ([cut, cut], [f - cut for f in full])
    return out


def measure(model, feeds: dict, options: ExecutionOptions, runs: int, sessions: int) -> dict:
    digests, times, first = [], [], None
    data = model.SerializeToString()
    for _ in range(sessions):
        session = create_session(data, options)
        for _ in range(runs):
            start = time.perf_counter()
            (out,) = session.run(None, feeds)
            times.append(1000 * (time.perf_counter() - start))
            digests.append(hashlib.sha1(np.ascontiguousarray(out).tobytes()).hexdigest())
            first = out if first is None else first
    return {"distinct": len(set(digests)), "total": len(digests), "median_ms": float(np.median(times)), "first": first}


def row(label: str, batch: int, mode: str, original, rewritten, feeds, options, args) -> dict:
    a = measure(original, feeds, options, args.runs, args.sessions)
    b = measure(rewritten, feeds, options, args.runs, args.sessions)
    diff = float(np.abs(a["first"].astype(np.float64) - b["first"]).max())
    result = {"geometry": label, "batch": batch, "mode": mode, "original_distinct": a["distinct"],
              "rewritten_distinct": b["distinct"], "runs": a["total"], "original_ms": a["median_ms"],
              "rewritten_ms": b["median_ms"], "max_abs_diff": diff}
    print(f"{label:34} {batch:>5} {mode:>10} {a['distinct']:>4}/{a['total']:<4} {a['median_ms']:9.3f} "
          f"{b['distinct']:>4}/{b['total']:<4} {b['median_ms']:9.3f} {b['median_ms'] / a['median_ms']:6.2f} {diff:10.3g}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ep", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--modes", default="EXHAUSTIVE,HEURISTIC,DEFAULT", help="cudnn_conv_algo_search modes (CUDA)")
    parser.add_argument("--geometries", default=",".join(DEFAULT_GEOMETRIES), help=f"of {list(CONV_TRANSPOSE_GEOMETRIES)}")
    parser.add_argument("--deterministic-compute", action="store_true")
    parser.add_argument("--scatter", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    geometries = [g.strip() for g in args.geometries.split(",") if g.strip()]
    unknown = [g for g in geometries if g not in CONV_TRANSPOSE_GEOMETRIES]
    if unknown:
        parser.error(f"unknown geometries {unknown}")
    modes = [m.strip().upper() for m in args.modes.split(",")] if args.ep == "cuda" else ["-"]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"ep {args.ep}, {args.runs} runs x {args.sessions} sessions, use_deterministic_compute={args.deterministic_compute}")
    print(f"{'geometry':34} {'batch':>5} {'mode':>10} {'original':>20} {'rewritten':>19} {'ratio':>6} {'max diff':>10}")
    print(f"{'':34} {'':5} {'':10} {'distinct':>9} {'ms':>9} {'distinct':>9} {'ms':>9}")
    rows = []
    for label in geometries:
        for batch in batches:
            original = conv_transpose_model(**realistic(CONV_TRANSPOSE_GEOMETRIES[label], batch), seed=1)
            rewritten, _ = determinize_model(original, DeterminizeOptions(check=False))
            shape = [d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim]
            feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
            for mode in modes:
                options = execution(args, mode)
                rows.append(row(label, batch, mode, original, rewritten, feeds, options, args))
    if args.scatter:
        rng = np.random.default_rng(3)
        indices = rng.integers(0, 128, (32, 1024)).astype(np.int64)
        original = scatter_model((32, 128), (32, 1024), axis=1, constant_indices=indices)
        rewritten, _ = determinize_model(original, DeterminizeOptions(check=False))
        feeds = {"data": rng.standard_normal((32, 128)).astype(np.float32),
                 "updates": rng.standard_normal((32, 1024)).astype(np.float32)}
        rows.append(row("ScatterElements add 32x1024->32x128", 1, modes[0], original, rewritten, feeds, execution(args, modes[0]), args))
    if args.json:
        args.json.write_text(json.dumps({"ep": args.ep, "runs": args.runs, "sessions": args.sessions,
                                         "deterministic_compute": args.deterministic_compute, "rows": rows}, indent=1))


def execution(args, mode: str) -> ExecutionOptions:
    if args.ep == "cpu":
        return ExecutionOptions(deterministic_compute=args.deterministic_compute or None)
    return ExecutionOptions("cuda", {"cudnn_conv_algo_search": mode, "use_tf32": False},
                            deterministic_compute=args.deterministic_compute or None)


if __name__ == "__main__":
    main()
