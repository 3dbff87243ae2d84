"""ONNX's own backend node tests, run through ``qconsist run --dump`` (issue 27 item 10, issue 29 item 10).

The cases come from onnx's generator (``onnx.backend.test.case.node.collect_testcases``: the models and data
sets ``onnx.backend.test.cmd_tools generate-data`` writes as ``node/<test>/model.onnx`` + ``test_data_set_0``),
made at test set-up. Each case's first data set is written as one ``.npz`` whose members are the model's inputs
by name — qconsist's exact input form, fed as it is — and the case is judged:

* ``ort_cannot_run``: onnxruntime itself cannot load or run it (counted; qconsist must then refuse the model in
  one line, exit 2, the failure being the model's);
* ``not_arrays``: an input that is no array of numbers (a sequence, an optional, strings) — no file holds it;
  qconsist, given the arrays there are, refuses the model in one line (exit 2);
* ``equal``: ``qconsist run --dump`` exits 0, its recorded outputs equal onnxruntime's plain outputs bit for bit
  and the dump is faithful;
* ``refused``: exit 2 or 3 with one ``error:`` line (the message is kept, to be counted);
* ``failed``: anything else — exit 4, an unfaithful dump, outputs that differ.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from typer.testing import CliRunner


@dataclass
class Outcome:
    name: str
    kind: str  # ort_cannot_run | not_arrays | equal | refused | failed
    detail: str = ""


def collect(folder: Path, wanted: Callable[[str, int], bool] = lambda name, index: True) -> list[Path]:
    """The node test cases (those ``wanted(name, position in name order)``) written to ``folder`` as
    ``<test>/model.onnx`` + ``<test>/feeds/000.npz`` (the first data set's arrays by input name); their folders."""
    import warnings

    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    written = []
    for position, case in enumerate(sorted(cases, key=lambda c: c.name)):
        if not wanted(case.name, position):
            continue
        target = folder / case.name
        (target / "feeds").mkdir(parents=True, exist_ok=True)
        (target / "model.onnx").write_bytes(case.model.SerializeToString())
        inputs, _ = case.data_sets[0]
        names = [i.name for i in case.model.graph.input]
        given = {n: _array(v) for n, v in zip(names, inputs)}
        arrays = {n: v for n, v in given.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"
                  and v.dtype.type.__module__ == "numpy"}  # float8/int4 (ml_dtypes) have no .npy form
        np.savez(target / "feeds" / "000.npz", **arrays)
        if len(arrays) < len(given):  # qconsist is given the arrays there are, and must refuse the rest
            (target / "not_arrays").write_text(", ".join(f"{n}: {type(v).__name__}" for n, v in given.items() if n not in arrays))
        written.append(target)
    return written


def _array(value: Any) -> Any:
    """A data set's input as numpy holds it: a numpy scalar or a ``TensorProto`` (how onnx gives float16 and
    exotic types) as an array; anything else (a list for a sequence, None for an empty optional) as it is."""
    from onnx import numpy_helper

    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value


def _equal(left: np.ndarray, right: np.ndarray) -> bool:
    return left.shape == right.shape and left.dtype == right.dtype and np.array_equal(
        left, right, equal_nan=left.dtype.kind in "fc")


_COMMAND: list[Any] = []


def _invoke(args: list[str]) -> Any:
    """``qconsist ARGS`` in this process; typer builds the command once (0.4 s a time otherwise)."""
    from unittest import mock

    import typer.testing

    from qconsist.cli import app

    if not _COMMAND:
        _COMMAND.append(typer.main.get_command(app))
    with mock.patch.object(typer.testing, "_get_command", lambda _: _COMMAND[0]):
        return CliRunner().invoke(app, args)


def run_case(case: Path, runs: Path) -> Outcome:
    """Judge one case (module docstring)."""
    import onnxruntime as ort

    name = case.name
    if (case / "not_arrays").exists():
        result = _invoke(["run", str(case / "model.onnx"), "--inputs", str(case / "feeds"), "--dump",
                          "--runs-dir", str(runs), "--run-id", name])
        lines = result.stderr.strip().splitlines()
        if result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "):
            return Outcome(name, "not_arrays", lines[0][:300])
        return Outcome(name, "failed", f"inputs {(case / 'not_arrays').read_text()}: exit {result.exit_code}: "
                                       f"{result.output.strip()[-300:]}")
    feed_file = case / "feeds" / "000.npz"
    with np.load(feed_file, allow_pickle=False) as archive:
        feeds = {k: archive[k] for k in archive.files}
    try:
        session = ort.InferenceSession(str(case / "model.onnx"), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors
        # not qconsist's to judge, but its failure is the model's: one line, exit 2, never an internal error
        result = _invoke(["run", str(case / "model.onnx"), "--inputs", str(case / "feeds"), "--dump",
                          "--runs-dir", str(runs), "--run-id", name])
        lines = result.stderr.strip().splitlines()
        if result.exit_code != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
            return Outcome(name, "failed", f"onnxruntime cannot run it; qconsist exit {result.exit_code}: "
                                           f"{result.output.strip()[-300:]}")
        return Outcome(name, "ort_cannot_run", " ".join(str(exc).split())[:160])
    result = _invoke(["run", str(case / "model.onnx"), "--inputs", str(case / "feeds"), "--dump",
                      "--runs-dir", str(runs), "--run-id", name])
    if result.exit_code in (2, 3):
        lines = result.stderr.strip().splitlines()
        ok = len(lines) == 1 and lines[0].startswith("error: ")
        return Outcome(name, "refused" if ok else "failed", result.stderr.strip()[:300])
    if result.exit_code != 0:
        return Outcome(name, "failed", f"exit {result.exit_code}: {result.output.strip()[-300:]}")
    run_dir = runs / name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    if not manifest["sections"]["dump"]["faithful"]:
        return Outcome(name, "failed", "dump not faithful")
    outputs = manifest["sections"]["inference"]["outputs"]
    for index, (output, want) in enumerate(zip(outputs, expected)):
        got = np.load(run_dir / "outputs" / f"o{index}.npy", allow_pickle=False)[0]
        if not _equal(got, np.asarray(want)):
            return Outcome(name, "failed", f"output {output} differs from onnxruntime's")
    return Outcome(name, "equal")


def message_kind(detail: str) -> str:
    """A refusal's message without the paths and numbers that differ by case, to count them by kind."""
    text = re.sub(r"/\S+", "PATH", detail)
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\d+", "N", text)
    return text[:110]


def counts(outcomes: list[Outcome]) -> dict[str, Any]:
    """Outcomes by kind (``ort_can_run``: the cases whose inputs are arrays and onnxruntime runs), and the
    refusals by message."""
    kinds = Counter(o.kind for o in outcomes)
    refused = Counter(message_kind(o.detail) for o in outcomes if o.kind in ("refused", "not_arrays"))
    return {"total": len(outcomes), "ort_can_run": kinds["equal"] + kinds["refused"] + kinds["failed"],
            **dict(kinds), "refused_by_message": dict(refused.most_common())}


def model_inputs(case: Path) -> list[str]:
    return [i.name for i in onnx.load(str(case / "model.onnx")).graph.input]
