"""onnxruntime's own log lines (its C++ logger writes to descriptor 2) go to the run's log file, summarized in one
line; Python's stderr (logging, progress bars, messages) stays on the terminal. Tested through real processes:
descriptor 2 is only real there."""

from __future__ import annotations

import json
import os
import re
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


# --- every session's log captured (issue 22): one place makes them all ------------------------------------------

# onnxruntime's default logger made verbose before qconsist runs: every session then logs at creation and at its
# first run ("Extending BFCArena…"), as the CUDA EP's kernels warn on a GPU ("OP Conv(convolution1) running in
# Fallback mode. May be extremely slow") from the first run of each session
VERBOSE = ("import sys, onnxruntime; onnxruntime.set_default_logger_severity(0); from qconsist.cli import main; "
           "sys.argv[0] = 'qconsist'; sys.exit(main())")
NOTE = re.compile(r"note: onnxruntime logged \d+ (line|warning|error)\(s\)[^\n]*\n")


def test_no_session_escapes_the_capture(tmp_path):
    """Each command, with a model whose tools' sessions warn (an unused initializer) and onnxruntime's default
    logger verbose, leaves on stderr nothing but qconsist's one-line summary."""
    model = build_classifier_model(tmp_path / "classifier.onnx")
    proto = onnx.load(str(model))
    proto.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "unused_weight"))
    onnx.save(proto, str(model))
    save_arrays(tmp_path / "arrays.npy", 4, seed=2)
    (tmp_path / "p.toml").write_text('name = "warn"\n[model]\nonnx = "classifier.onnx"\n[calibration]\ndata = "arrays.npy"\n'
                                     'repeat = 2\n')
    (tmp_path / "nightly.toml").write_text(
        'runs_dir = "night"\n[[models]]\nname = "warn"\n[models.pipeline.model]\nonnx = "classifier.onnx"\n'
        '[models.pipeline.calibration]\ndata = "arrays.npy"\nrepeat = 2\n')
    commands = {
        "pipeline": ["pipeline", "run", "p.toml", "--run-id", "p"],
        "run": ["run", "classifier.onnx", "--inputs", "arrays.npy", "--dump", "--run-id", "r"],
        "calib repeat": ["calib", "repeat", "classifier.onnx", "--inputs", "arrays.npy", "-n", "2"],
        "quant-error": ["quant-error", "runs/p", "--inputs", "arrays.npy"],
        "locate fp16": ["locate", "runs/p", "--stage", "optimize", "--precision", "fp16", "--ep", "cpu", "--inputs", "arrays.npy"],
        "gate": ["gate", "runs/p"],
        "nightly": ["nightly", "nightly.toml"],
    }
    for what, args in commands.items():
        out = subprocess.run([sys.executable, "-c", VERBOSE, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode in (0, 1), (what, out.stderr[-2000:])
        stderr = "".join(line for line in out.stderr.splitlines(True) if not line.startswith("progress "))  # piped: 10 s lines
        assert NOTE.fullmatch(stderr) or (what == "nightly" and stderr == ""), (what, out.stderr[:3000])
        assert "onnxruntime:" not in out.stdout, what
    kept = (tmp_path / "runs" / "p" / "onnxruntime.log").read_text()
    assert WARNING in kept and "[I:onnxruntime:" in kept  # the tools' warning and the verbose lines, in the run
    locate = next(p for p in (tmp_path / "runs").iterdir() if p.name.startswith("locate-"))
    assert "[I:onnxruntime:" in (locate / "onnxruntime.log").read_text()
    entry = next(p for p in (tmp_path / "night").iterdir() if p.name.startswith("warn-entry-"))
    assert json.loads((entry / "manifest.json").read_text())["sections"]["onnxruntime_log"]["lines"] > 0  # the gate's sessions


def test_a_library_session_outside_any_run_logs_one_summary(tmp_path):
    """Used as a library, with no run directory and no CLI around it: the session's log is captured all the same
    (nothing on stderr) and said in one logged line per call into onnxruntime, its lines at debug level."""
    model = build_classifier_model(tmp_path / "classifier.onnx")
    # info, not verbose: the verbose lines of onnxruntime's thread pool come from its threads whenever they start,
    # outside any call (the CLI's capture of the whole command holds them; a library call's cannot)
    script = textwrap.dedent(f"""
        import logging
        import numpy as np, onnxruntime
        onnxruntime.set_default_logger_severity(1)
        logging.basicConfig(filename={str(tmp_path / "library.log")!r}, level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        from qconsist.inference.session import create_session
        session = create_session({str(model)!r})
        session.run(None, {{"x": np.ones((1, 3, 8, 8), np.float32)}})
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    logged = (tmp_path / "library.log").read_text()
    summaries = re.findall(r"^DEBUG qconsist\.inference\.session: onnxruntime logged \d+ line\(s\)$", logged, re.MULTILINE)
    assert len(summaries) == 2  # making the session, running it
    assert "Extending BFCArena" in logged  # the first run's lines, kept at debug level
