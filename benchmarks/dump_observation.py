"""The cost of observation, per execution provider: plain inference vs dump, batch 1 and batch 32, side by side.

Usage: python benchmarks/dump_observation.py MODEL [--eps cpu,cuda] [--batches 1,32] [--steps N] [--bases BASES.npy]

MODEL: an ONNX model with a dynamic batch (open_nsfw QDQ: `pipeline run` with [convert] dynamic_batch = true).
Inputs: augmented bundled photos (``package:photos:augmented``), or base photos from BASES.npy (a machine
without scikit-image). For each EP and batch, in one process, interleaved REPEATS times:

- plain: the production session (numpy in and out);
- host dump: every tensor of ORT's optimized graph exposed and returned as numpy (exposure + transfers),
  then fingerprinted by the CPU kernels (fingerprints);
- device dump (CUDA): outputs bound to one preallocated CUDA buffer (exposure), fingerprinted there
  (fingerprints), final outputs copied back (transfers).

Prints ms per sample and ratios to plain; the shares of exposure, transfers and fingerprints. On the CUDA EP
it also checks, for the first step, that device and host records agree hash for hash.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def steps_for(bases: np.ndarray, batch: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    from qconsist.inputs.augment import AugmentedPhotos

    make = AugmentedPhotos(bases, (224, 224), seed)
    return [np.concatenate([make(s * batch + r) for r in range(batch)]) for s in range(steps)]


def load_bases(path: str | None) -> np.ndarray:
    if path:
        return np.load(path)
    from qconsist.inputs.augment import base_photos
    from qconsist.inputs.photos import package_photos
    from qconsist.pipeline.config import load_pipeline

    return base_photos(package_photos(), load_pipeline(Path(__file__).parent.parent / "pipelines/open_nsfw.toml").preprocess)


def timed(fn, feeds) -> float:
    fn(feeds[0])
    start = time.perf_counter()
    for feed in feeds:
        fn(feed)
    return (time.perf_counter() - start) / len(feeds)


def measure(model: Path, ep: str, batch: int, feeds: list[np.ndarray], repeats: int, folder: Path) -> dict:
    from qconsist.inference.dump import batched_columns, plan_dump
    from qconsist.inference.fingerprint import FingerprintTable
    from qconsist.inference.session import ExecutionOptions, create_session

    options = ExecutionOptions(ep, {"cudnn_conv_algo_search": "HEURISTIC"} if ep == "cuda" else {})
    production = create_session(model, options)
    name = production.get_inputs()[0].name
    steps = [{name: f} for f in feeds]
    plan = plan_dump(model, options, folder / f"{ep}-{batch}", {name: feeds[0][:1]})
    plan.batched = batched_columns(plan.session, [t.name for t in plan.tensors], {name: feeds[0][:1]})
    names = [t.name for t in plan.tensors]
    table = FingerprintTable(folder / f"{ep}-{batch}.npy", batch, len(names))
    host = {"plain": [], "exposure+transfers": [], "fingerprints": []}
    device = {"exposure": [], "fingerprints": [], "transfers": []}
    dd = None
    if ep == "cuda":
        from qconsist.inference.device import DeviceDump

        dd = DeviceDump(plan.session, names, plan.dtypes, plan.batched, table.shapes)
        final = [names.index(o) for o in plan.outputs]
    held = [plan.session.run(names, steps[0])]

    def fingerprints(_):
        for r, row in enumerate(plan.rows(held[0], batch)):
            table.write_row(r, row)

    for _ in range(repeats):
        host["plain"].append(timed(lambda s: production.run(None, s), steps))
        host["exposure+transfers"].append(timed(lambda s: held.__setitem__(0, plan.session.run(names, s)), steps))
        host["fingerprints"].append(timed(fingerprints, steps))
        if dd is not None:
            before = dict(dd.seconds)
            dd.run(steps[0], batch, final)
            before = dict(dd.seconds)
            for s in steps:
                dd.run(s, batch, final)
            for key in device:
                device[key].append((dd.seconds[key] - before[key]) / len(steps))
    out = {"ep": ep, "batch": batch, "tensors": len(names), "mb_per_step": sum(a.nbytes for a in held[0]) / 1e6}
    med = {k: float(np.median(v)) * 1000 / batch for k, v in {**host, **{"device " + k: v for k, v in device.items()}}.items() if v}
    out["ms_per_sample"] = med
    plain = med["plain"]
    out["host_dump_ratio"] = (med["exposure+transfers"] + med["fingerprints"]) / plain
    if dd is not None:
        total = med["device exposure"] + med["device fingerprints"] + med["device transfers"]
        out["device_dump_ratio"] = total / plain
        out["device_shares"] = {k: med["device " + k] / total for k in device}
        records, _ = dd.run(steps[0], batch, final)
        arrays = plan.session.run(names, steps[0])
        for r, row in enumerate(plan.rows(arrays, batch)):
            table.write_row(r, row)
        host_rows = np.array(table._table[:batch])
        out["device_vs_host_hash_mismatches"] = int((records["hash"] != host_rows["hash"]).sum())
        out["device_vs_host_minmax_mismatches"] = int(((records["min"] != host_rows["min"]) & ~np.isnan(host_rows["min"])).sum()
                                                      + ((records["max"] != host_rows["max"]) & ~np.isnan(host_rows["max"])).sum())
        out["device_vs_host_max_mean_rel"] = float(np.nanmax(np.abs(records["mean"] - host_rows["mean"]) / np.maximum(np.abs(host_rows["mean"]), 1e-30)))
    out["host_shares"] = {k: med[k] / (med["exposure+transfers"] + med["fingerprints"]) for k in ("exposure+transfers", "fingerprints")}
    table.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("--eps", default="cpu,cuda")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--steps", type=int, default=0, help="steps per measurement (default: 64 samples' worth)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bases")
    parser.add_argument("--json")
    parser.add_argument("--chunk-words", type=int, help="words per block of the device fingerprint kernel")
    args = parser.parse_args()
    if "cuda" in args.eps:
        import onnxruntime

        if hasattr(onnxruntime, "preload_dlls"):
            onnxruntime.preload_dlls()
    if args.chunk_words:
        from qconsist.inference import device

        device.CHUNK_WORDS = args.chunk_words
    bases = load_bases(args.bases)
    results = []
    with tempfile.TemporaryDirectory(prefix="qconsist-observe-") as tmp:
        for ep in args.eps.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                steps = args.steps or max(2, 64 // batch)
                r = measure(args.model, ep, batch, steps_for(bases, batch, steps), args.repeats, Path(tmp))
                results.append(r)
                ms = r["ms_per_sample"]
                line = (f"{ep:4s} batch {batch:2d}: {r['tensors']} tensors, {r['mb_per_step']:.0f} MB/step | plain {ms['plain']:.3f} ms/sample"
                        f" | host dump {ms['exposure+transfers'] + ms['fingerprints']:.3f} ({r['host_dump_ratio']:.2f}x; exposure+transfers "
                        f"{r['host_shares']['exposure+transfers']:.0%}, fingerprints {r['host_shares']['fingerprints']:.0%})")
                if "device_dump_ratio" in r:
                    sh = r["device_shares"]
                    line += (f" | device dump {r['device_dump_ratio']:.2f}x (exposure {sh['exposure']:.0%}, fingerprints "
                             f"{sh['fingerprints']:.0%}, transfers {sh['transfers']:.0%}); device vs host: "
                             f"{r['device_vs_host_hash_mismatches']} hash, {r['device_vs_host_minmax_mismatches']} min/max mismatches, "
                             f"mean rel {r['device_vs_host_max_mean_rel']:.1e}")
                print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
