"""Per-layer fidelity table of the convert stage: every case of ``tests/caffe_builder.LAYER_CASES`` (each
supported Caffe layer type and its parameter variants) converted with ``convert_caffe`` and run in
onnxruntime (CPU, default optimisation), against the float64 numpy reference of Caffe.

Columns: layer type, variant, max |onnx - reference|, the tolerance the tests hold it to
(1e-5 * (1 + peak)), what caffe2onnx 2.0.1 alone does with it, and qconsist's repair.

    .venv/bin/python benchmarks/convert_fidelity.py [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from caffe_builder import LAYER_CASES, run, session, tolerance, verdict_alone  # noqa: E402

from qconsist.stages.caffe import reference  # noqa: E402
from qconsist.stages.caffe.fidelity import seeded_inputs  # noqa: E402
from qconsist.stages.caffe.proto import read_caffemodel, read_prototxt  # noqa: E402
from qconsist.stages.convert import ConvertOptions, convert_caffe  # noqa: E402

BOOKKEEPING = ("removed ", "outputs named")


def measure(root: Path) -> list[dict]:
    rows = []
    for i, case in enumerate(LAYER_CASES):
        net = case.network(seed=i)
        prototxt, caffemodel = net.write(root, f"case{i}")
        result = convert_caffe(prototxt, caffemodel, root / f"case{i}.onnx", ConvertOptions(check=False))
        inputs = seeded_inputs(net.net, seed=100 + i)
        expected = list(reference.forward(read_prototxt(prototxt), read_caffemodel(caffemodel), inputs, dtype=np.float64).values())
        actual = run(session(result.path), inputs)
        diff = max(float(np.abs(a.astype(np.float64) - e).max()) for a, e in zip(actual, expected))
        tol = min(tolerance(e) for e in expected)
        repairs = [r for r in result.repairs if not r.startswith(BOOKKEEPING)]
        rows.append({
            "layer": case.layer, "variant": case.id, "max_abs": diff, "tolerance": tol, "passed": diff <= tol,
            "alone": verdict_alone(case, prototxt, caffemodel, inputs, expected),
            "repair": " | ".join(repairs) or "-",
        })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(Path(tmp))
    if args.markdown:
        print("| layer | variant | max abs diff | tolerance | caffe2onnx alone | qconsist repair |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['layer']} | {r['variant']} | {r['max_abs']:.1e} | {r['tolerance']:.1e} | {r['alone']} | {r['repair']} |")
    else:
        print(f"{'layer':<13} {'variant':<46} {'max abs':>9} {'tol':>9}  {'alone':<8} repair")
        for r in rows:
            print(f"{r['layer']:<13} {r['variant']:<46} {r['max_abs']:9.1e} {r['tolerance']:9.1e}  {r['alone']:<8} {r['repair'][:110]}")
    failed = [r["variant"] for r in rows if not r["passed"]]
    print(f"\n{len(rows)} cases, {len(rows) - len(failed)} within tolerance; caffe2onnx alone: "
          + ", ".join(f"{k} {sum(r['alone'] == k for r in rows)}" for k in ("ok", "wrong", "invalid", "crash")))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
