"""onnxruntime's own log lines (its C++ logger writes to descriptor 2) go to the run's log file, summarized in one
line; Python's stderr (logging, progress bars, messages) stays on the terminal. Tested through real processes:
descriptor 2 is only real there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_builders import build_classifier_model, save_arrays

BIN = Path(sys.executable).parent
WARNING = "Removing initializer 'unused_weight'. It is not used by any node and should be removed from the model."


def test_capture_keeps_python_stderr_on_the_terminal(tmp_path):
    script = textwrap.dedent(f"""
        import logging, os, sys
        from pathlib import Path
        from qconsist.store.ortlog import capture_ort_log
        logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
        folder = Path({str(tmp_path)!r})
        with capture_ort_log(folder / "outer.log") as outer:
            os.write(2, b"\\x1b[0;93m2026-01-01 00:00:00.0 [W:onnxruntime:, graph.cc:1 Clean] native one\\x1b[m\\n")
            print("python message", file=sys.stderr)
            logging.warning("python logging")
            with capture_ort_log(folder / "inner.log") as inner:
                os.write(2, b"2026-01-01 00:00:00.0 [E:onnxruntime:, x.cc:2 Run] native two\\n")
                print("python inside", file=sys.stderr)
            os.write(2, b"plain native line\\n")
        with capture_ort_log(folder / "empty.log") as empty:
            print("nothing native", file=sys.stderr)
        print(outer.summary(), inner.summary(), empty.summary(), sep="\\n")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "python message\nWARNING python logging\npython inside\nnothing native\n"
    outer, inner, empty = out.stdout.splitlines()
    assert outer == f"onnxruntime logged 1 warning(s), 0 error(s) to {tmp_path / 'outer.log'}; first: native one"
    assert inner == f"onnxruntime logged 0 warning(s), 1 error(s) to {tmp_path / 'inner.log'}; first: native two"
    assert empty == "None" and not (tmp_path / "empty.log").exists()
    assert (tmp_path / "outer.log").read_text().splitlines()[1] == "plain native line"
    assert "native two" in (tmp_path / "inner.log").read_text()


def test_pipeline_run_keeps_onnxruntime_warnings_in_the_run(tmp_path):
    model = build_classifier_model(tmp_path / "classifier.onnx")
    proto = onnx.load(str(model))
    proto.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "unused_weight"))
    onnx.save(proto, str(model))
    save_arrays(tmp_path / "arrays.npy", 12, seed=2)
    (tmp_path / "p.toml").write_text('name = "warn"\n[model]\nonnx = "classifier.onnx"\n[calibration]\ndata = "arrays.npy"\n')
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["qconsist", "pipeline", "run", "p.toml", "--runs-dir", "runs", "--run-id", "w"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    log = Path("runs") / "w" / "onnxruntime.log"
    assert out.stderr == f"note: onnxruntime logged 1 warning(s), 0 error(s) to {log}; first: {WARNING}\n"
    assert "[W:onnxruntime:" not in out.stdout
    assert WARNING in (tmp_path / log).read_text()
    manifest = json.loads((tmp_path / "runs" / "w" / "manifest.json").read_text())
    assert manifest["sections"]["onnxruntime_log"] == {"path": str(log), "lines": 1, "warnings": 1, "errors": 0, "first": WARNING}
