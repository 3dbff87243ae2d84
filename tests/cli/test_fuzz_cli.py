"""The CLI itself under fuzzing: random subcommands x generated hostile files (models, arrays, images, TOML,
run directories, history databases) and options. The contract (docs/trust.md, "Exit codes"): the exit code is 0, 1,
2 or 3 — never 4 (a bug) and never anything else; no traceback; an error is one ``error:`` line, the last one;
and the runs folder holds only complete runs, none at all after an error.

Hypothesis, derandomized and without a database, so CI runs the same 500 cases every time."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from hostile_files import npz_archives, png_header
from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.store.rundir import list_runs

CASES = 500
FUZZ = settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Valid things to start from: the small classifier, its arrays, a pipeline file, one complete run (with its
    QDQ model), and a nightly history database."""
    folder = tmp_path_factory.mktemp("fuzz-corpus")
    model = build_classifier_model(folder / "classifier.onnx")
    arrays = save_arrays(folder / "arrays.npy", 3, seed=2)
    pipeline = folder / "pipeline.toml"
    pipeline.write_text(f'name = "fuzz"\n[model]\nonnx = "{model}"\n[calibration]\ndata = "{arrays}"\n'
                        f'[quantize]\nper_channel = false\n[evaluation]\ndata = "{arrays}"\ncount = 2\n')
    result = CliRunner().invoke(app, ["pipeline", "run", str(pipeline), "--runs-dir", str(folder / "runs"), "--run-id", "good"])
    assert result.exit_code == 0, result.output
    from qconsist.history import History

    History(folder / "history.sqlite").start_night("n1", "nightly.toml", {"python": "3.11"})
    return {"folder": folder, "model": model, "arrays": arrays, "pipeline": pipeline, "run": folder / "runs" / "good",
            "qdq": folder / "runs" / "good" / "quantize" / "model.onnx", "history": folder / "history.sqlite",
            "npz": npz_archives(folder / "npz", name="x", shape=(2, 3, 8, 8), bomb_mib=8)}


def _mutate(text: str) -> st.SearchStrategy:
    """The text with a slice replaced by random text."""
    return st.tuples(st.integers(0, len(text)), st.integers(0, 30), st.text(max_size=20)).map(
        lambda t: text[: t[0]] + t[2] + text[t[0] + t[1]:])


SUFFIXES = [".onnx", ".toml", ".npy", ".npz", ".png", ".json", ".sqlite", ".jpg", ""]
SHAPES = [(0, 3, 8, 8), (2, 3, 8, 8), (1, 3, 9, 9), (2, 8, 8), (3,), ()]
DTYPES = ["float32", "float64", "float16", "int8", "bool", "complex64"]
FILLS = [0.0, 1.0, np.nan, np.inf, -np.inf, 1e38]
MODES = ["RGB", "L", "I;16", "RGBA", "CMYK", "P", "1", "F", "LA"]

# a file spec: (kind, details); ``_make`` writes it in the example's folder
file_specs = st.one_of(
    st.tuples(st.just("bytes"), st.tuples(st.binary(max_size=200), st.sampled_from(SUFFIXES))),
    st.tuples(st.just("truncated-model"), st.integers(0, 3000)),
    st.tuples(st.just("corpus"), st.sampled_from(["model", "arrays", "pipeline", "run", "qdq", "history"])),
    st.tuples(st.just("array"), st.tuples(st.sampled_from(SHAPES), st.sampled_from(DTYPES), st.sampled_from(FILLS), st.booleans())),
    st.tuples(st.just("pipeline"), st.text(max_size=0)),  # mutated below, with the corpus' text
    st.tuples(st.just("rundir"), st.sampled_from(["empty", "running", "garbage", "mutated", "no-artifacts"])),
    st.tuples(st.just("image"), st.tuples(st.sampled_from(MODES), st.sampled_from([(1, 1), (8, 8), (30000, 30000)]), st.booleans())),
    st.tuples(st.just("missing"), st.just("")),
    st.tuples(st.just("folder"), st.sampled_from(["empty", "mixed", "images"])),
    # issue 29: hostile .npz archives, a manifest nested 100,000 deep, a project folder that is not a runs folder
    st.tuples(st.just("npz"), st.sampled_from(["good", "truncated", "member", "claims", "bomb", "text"])),
    st.tuples(st.just("rundir"), st.just("deep")),
    st.tuples(st.just("project"), st.just("")),
)
# most cases start from something valid for the command, so that the hostile part (the other file, an option,
# a mutated pipeline) is reached and not only the first check
def _corpus(*names: str) -> st.SearchStrategy:
    return st.tuples(st.just("corpus"), st.sampled_from(names))


mutated_pipeline = st.tuples(st.just("pipeline"), st.just(""))
FIRST = {
    "pipeline": st.one_of(mutated_pipeline, mutated_pipeline, _corpus("pipeline"), file_specs),
    "calib": st.one_of(_corpus("model", "pipeline", "qdq"), mutated_pipeline, file_specs),
    "history": st.one_of(_corpus("history"), file_specs),
    **{name: st.one_of(st.tuples(st.just("project"), st.just("")), file_specs) for name in ("runs-rm", "runs-rm-old", "runs-list")},
}
SECOND = {
    "report": st.one_of(_corpus("run"), file_specs),
    "gate-policy": st.one_of(mutated_pipeline, file_specs),
}
default_first = st.one_of(_corpus("model", "run", "qdq"), _corpus("run"), file_specs)
default_second = st.one_of(_corpus("arrays", "run"), file_specs)
mutation = st.tuples(st.integers(0, 400), st.integers(0, 30), st.text(max_size=20))
numbers = st.one_of(st.sampled_from(["2", "3"]), st.sampled_from(["-1", "0", "1", "2", "3", "1000000000", "x", ""]))
words = st.sampled_from(["cpu", "cpu", "cpu", "cuda", "quantize", "optimize", "convert", "nope", "", "all", "disable", "fp16", "fp32", "QDQ"])

COMMANDS = {
    "pipeline": lambda f, g, n, w: ["pipeline", "run", f],
    "calib": lambda f, g, n, w: ["calib", "repeat", f, "--inputs", g, "-n", n] if f.endswith(".onnx") else ["calib", "repeat", f, "-n", n],
    "run": lambda f, g, n, w: ["run", f, "--inputs", g, "--count", n],
    "run-stage": lambda f, g, n, w: ["run", f, "--inputs", g, "--stage", w, "--ep", "cpu"],
    "run-level": lambda f, g, n, w: ["run", f, "--inputs", g, "--level", w, "--batch-size", n],
    "diff": lambda f, g, n, w: ["diff", f, g],
    "gate": lambda f, g, n, w: ["gate", f, "--baseline", g],
    "gate-policy": lambda f, g, n, w: ["gate", f, "--policy", g, "--junit", "out/j.xml"],
    "report": lambda f, g, n, w: ["report", f, g, "-o", "out/report.html"],
    "history": lambda f, g, n, w: ["history", w or "m", "--history", f],
    "locate": lambda f, g, n, w: ["locate", f, "--inputs", g, "--precision", "fp16", "--ep", w, "--count", n],
    "locate-matrix": lambda f, g, n, w: ["locate", f, "--inputs", g, "--ep", w, "--repeats", n],
    "explain": lambda f, g, n, w: ["explain", f, g],
    "sensitivity": lambda f, g, n, w: ["sensitivity", f, "--target", f"sqnr>={n}", "--candidates", n, "--timed-runs", "3",
                                       "--warmup", "0", *(["--inputs", g] if w in ("all", "QDQ") else [])],
    "models": lambda f, g, n, w: ["models", "list"],
    "env": lambda f, g, n, w: ["env", "--json"],
    "runs-rm": lambda f, g, n, w: ["runs", "rm", "--incomplete", "--runs-dir", f],
    "runs-rm-old": lambda f, g, n, w: ["runs", "rm", "--older-than", "0s", "--runs-dir", f],
    "runs-list": lambda f, g, n, w: ["runs", "list", "--runs-dir", f],
}
RUN_COMMANDS = {"pipeline", "run", "run-stage", "run-level", "locate", "locate-matrix", "sensitivity"}

_counter = itertools.count()


def _make(spec, folder: Path, corpus, edit) -> Path:
    kind, details = spec
    name = folder / f"f{next(_counter)}"
    if kind == "bytes":
        blob, suffix = details
        path = name.with_suffix(suffix) if suffix else name
        path.write_bytes(blob)
        return path
    if kind == "truncated-model":
        path = name.with_suffix(".onnx")
        path.write_bytes(corpus["model"].read_bytes()[:details])
        return path
    if kind == "corpus":
        return corpus[details]
    if kind == "array":
        shape, dtype, fill, stacked = details
        with np.errstate(over="ignore", invalid="ignore"):
            data = np.full(shape, fill if np.dtype(dtype).kind in "fc" else 1).astype(dtype)
        path = name.with_suffix(".npz" if stacked else ".npy")
        if stacked:
            np.savez(path, x=data)
        else:
            np.save(path, data)
        return path
    if kind == "pipeline":
        start, length, text = edit
        original = corpus["pipeline"].read_text()
        path = name.with_suffix(".toml")
        path.write_text(original[:start] + text + original[start + length:])
        return path
    if kind == "npz":
        return corpus["npz"][details]
    if kind == "project":  # sources, data, a runs folder and one killed run: only the killed run is ever removed
        path = name
        (path / "src").mkdir(parents=True)
        (path / "src" / "main.py").write_text("print(1)\n")
        (path / "data").mkdir()
        shutil.copyfile(corpus["arrays"], path / "data" / "arrays.npy")
        shutil.copytree(corpus["run"], path / "runs" / "good")
        (path / "dead").mkdir()
        (path / "dead" / "RUNNING.json").write_text(json.dumps({"run_id": "dead", "kind": "pipeline", "pid": 2**22 + 7,
                                                                 "started": "2026-01-01T00:00:00Z"}))
        return path
    if kind == "rundir":
        path = name
        if details == "deep":
            path.mkdir()
            (path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
        elif details == "empty":
            path.mkdir()
        elif details == "running":
            path.mkdir()
            (path / "RUNNING.json").write_text('{"run_id": "x", "pid": 1, "started": "2026"}')
        elif details == "garbage":
            path.mkdir()
            (path / "manifest.json").write_bytes(b'{"schema": "qconsist.run/1", "status": "complete", "stages": "x"')
        else:
            shutil.copytree(corpus["run"], path)
            if details == "no-artifacts":
                shutil.rmtree(path / "quantize")
            else:
                start, length, text = edit
                manifest = (path / "manifest.json").read_text()
                (path / "manifest.json").write_text(manifest[:start] + text + manifest[start + length:])
        return path
    if kind == "image":
        mode, size, truncated = details
        path = name.with_suffix(".tif" if mode == "F" else (".jpg" if mode == "CMYK" else ".png"))
        if size == (30000, 30000):
            return png_header(path, *size)
        Image.new(mode, size).save(path)
        if truncated:
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
        return path
    if kind == "folder":
        path = name
        path.mkdir()
        if details in ("mixed", "images"):
            Image.new("RGB", (8, 8), (1, 2, 3)).save(path / "a.png")
        if details == "mixed":
            np.save(path / "b.npy", np.zeros((1, 3, 8, 8), np.float32))
        return path
    return name.with_suffix(".onnx")  # missing


@st.composite
def cases(draw):
    command = draw(st.sampled_from(sorted(COMMANDS)))
    return command, draw(FIRST.get(command, default_first)), draw(SECOND.get(command, default_second))


@FUZZ
@given(case=cases(), number=numbers, word=words, edit=st.one_of(st.just((0, 0, "")), mutation), json_flag=st.booleans())
def test_cli_keeps_its_exit_code_contract(corpus, tmp_path, case, number, word, edit, json_flag):
    command, first, second = case
    folder = tmp_path / f"case{next(_counter)}"
    folder.mkdir()
    (folder / "out").mkdir()
    runs = folder / "runs"
    f, g = (str(_make(spec, folder, corpus, edit)) for spec in (first, second))
    args = COMMANDS[command](f, g, number, word)
    if command in RUN_COMMANDS:
        args += ["--runs-dir", str(runs)]
    if json_flag and command not in ("report", "models", "env"):
        args.append("--json")
    args = [a.replace("out/", f"{folder}/out/") for a in args]

    kept = [p for p in (Path(f) / "src" / "main.py", Path(f) / "runs" / "good" / "manifest.json") if p.is_file()]
    result = CliRunner().invoke(app, args)

    case = f"qconsist {' '.join(args)}"
    assert all(p.is_file() for p in kept), f"{case}: removed {[str(p) for p in kept if not p.is_file()]}"
    assert result.exit_code in (0, 1, 2, 3), f"{case}: exit {result.exit_code}\n{result.output}"
    assert "Traceback" not in result.output, case
    errors = [line for line in result.stderr.splitlines() if line.startswith(("error:", "internal error:", "Error:", "Usage:"))]
    if result.exit_code in (2, 3):
        assert len(errors) == 1 and result.stderr.splitlines()[-1] == errors[0], f"{case}:\n{result.stderr}"
    else:
        assert errors == [], f"{case}:\n{result.stderr}"
    states = [state for _, state in list_runs(runs)]
    assert all(state == "complete" for state in states), f"{case}: left {states} in runs/"
    if result.exit_code >= 2:
        assert states == [], f"{case}: exit {result.exit_code} left runs {states}"
    if "--json" in args and result.exit_code in (0, 1) and result.stdout.strip():
        json.loads(result.stdout)  # --json output is JSON (non-finite numbers as null)
    shutil.rmtree(folder)

