"""A host dump's tensors that ORT holds in another form than the one recorded (NCHWc channel blocks, another axis
order) are put in the recorded form by the threads that fingerprint them, column by column, not by the thread that
runs the sessions (issue 31 item 4: 4.5 ms a sample of copies on that thread for the float open_nsfw, 54 of its 59
tensors blocked); the records and raw tensors are those the copy made before the fingerprints gave.

Models built in code with NCHWc-blocked tensors (``nchwc_models.py``: integer weights and inputs, exact in float32).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dump_tables import assert_records_alone
from nchwc_models import integer_inputs, padded_model
from qconsist.cli import app
from qconsist.inference import ExecutionOptions
from qconsist.inference import dump as dump_module
from qconsist.inference import layout
from qconsist.inference.dump import plan_dump
from qconsist.inference.fingerprint import RowWork, ShapeTable, fingerprint_row
from qconsist.inference.recording import HostDump
from qconsist.inference.session import create_session
from qconsist.store.fingerprints import CompactTable


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forms")
    return padded_model(folder / "padded.onnx"), integer_inputs(folder / "padded.npz", 20, count=4)


def _feeds(inputs: Path) -> list[dict[str, np.ndarray]]:
    with np.load(inputs) as given:
        return [{"x": given["x"][i:i + 1], "z": given["z"][i:i + 1]} for i in range(len(given["x"]))]


def test_recorded_shapes_are_those_of_the_copies():
    array = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for perm in [(), (0, 2, 3, 1), (0, 3, 1, 2), (1, 0, 2, 3)]:
        assert layout.original_shape(array.shape, perm) == layout.to_original(array, perm).shape
    blocked = np.zeros((1, 32, 3, 5), np.float32)
    assert layout.unblocked_shape(blocked.shape, 16, 20) == layout.unblock(blocked, 16, 20).shape == (1, 20, 3, 5)
    viewed = np.zeros((2, 3, 3, 5, 8), np.float32)  # ORT's (N, Cp/b, H, W, b) view, blocks of 8
    assert layout.unblocked_shape(viewed.shape, 8, 17) == layout.unblock(viewed, 8, 17).shape == (2, 17, 3, 5)
    with pytest.raises(ValueError, match=r"a tensor of 32 NCHWc channels \(blocks of 16\) cannot hold 12 channels"):
        layout.unblocked_shape((1, 32, 2, 2), 16, 12)
    with pytest.raises(ValueError, match=r"a tensor of shape \(1, 20, 2, 2\) is not held in NCHWc blocks of 16"):
        layout.unblocked_shape((1, 20, 2, 2), 16, 20)
    with pytest.raises(ValueError, match=r"a tensor of rank 3 cannot take the layout permutation \(0, 2, 3, 1\)"):
        layout.original_shape((1, 2, 3), (0, 2, 3, 1))


def test_forms_made_by_the_threads_that_take_their_columns_record_as_the_copies():
    """RowWork's forms: each column made in its recorded form by whichever thread takes it gives the records of the
    recorded arrays fingerprinted alone, the same shape table, and ``arrays`` holds the recorded arrays."""
    rng = np.random.default_rng(31)
    shapes, last, expected_shapes, expected_last = ShapeTable(), None, ShapeTable(), None
    for sample in range(3):
        held = [rng.standard_normal((1, 32, 4, 4)).astype(np.float32),  # blocks of 16 holding 20 channels
                rng.standard_normal((1, 4, 4, 3)).astype(np.float32),  # NHWC of an NCHW tensor
                np.arange(7, dtype=np.int64) + sample]
        recorded = [layout.unblock(held[0], 16, 20), layout.to_original(held[1], (0, 2, 3, 1)), held[2]]
        forms = {0: ((1, 20, 4, 4), lambda a=held[0]: layout.unblock(a, 16, 20)),
                 1: ((1, 3, 4, 4), lambda a=held[1]: layout.to_original(a, (0, 2, 3, 1)))}
        work = RowWork(held, shapes, last, forms)
        helpers = [threading.Thread(target=work.work) for _ in range(2)]
        for helper in helpers:
            helper.start()
        row = work.row()
        for helper in helpers:
            helper.join()
        expected = fingerprint_row(recorded, expected_shapes, expected_last)
        assert row.tobytes() == expected.tobytes()
        assert all(np.array_equal(a, b) and a.shape == b.shape for a, b in zip(work.arrays, recorded))
        last, expected_last = row, expected
    assert shapes.shapes == expected_shapes.shapes == [(1, 20, 4, 4), (1, 3, 4, 4), (7,)]


def test_a_form_of_another_shape_than_announced_fails_the_row():
    held = [np.zeros((1, 32, 2, 2), np.float32)]
    work = RowWork(held, ShapeTable(), None, {0: ((1, 21, 2, 2), lambda: layout.unblock(held[0], 16, 20))})
    with pytest.raises(ValueError, match=r"column 0: its recorded form has shape \(1, 20, 2, 2\), not \(1, 21, 2, 2\)"):
        work.row()


def _in_fingerprinting() -> bool:
    """Whether the calling code runs inside ``RowWork._record`` (a column being fingerprinted)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_record" and frame.f_code.co_filename.endswith("fingerprint.py"):
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("overlap", [True, False])
def test_the_session_thread_leaves_the_blocks_to_the_fingerprinting(padded, tmp_path, monkeypatch, overlap):
    """Every blocked tensor of the host dump is put in NCHW inside the fingerprinting of its column (by the worker, or
    the recording thread helping while it waits), never before the tensors are handed to the recorder; the records
    and the raw tensors equal those of a separate run of the session put in NCHW (``DumpPlan.to_original``) and
    fingerprinted alone."""
    monkeypatch.setattr(dump_module, "OVERLAP", overlap)
    model, inputs = padded
    feeds = _feeds(inputs)
    options = ExecutionOptions()
    plan = plan_dump(model, options, tmp_path / "dump")
    assert len(plan.unblocked) == 4 and plan.block == layout.block_size()
    production = create_session(model, options)
    unblocked_where: list[bool] = []
    unblock = dump_module.unblock

    def spy(array, block, channels):
        unblocked_where.append(_in_fingerprinting())
        return unblock(array, block, channels)

    monkeypatch.setattr(dump_module, "unblock", spy)
    columns = len(plan.tensors)
    recorder = HostDump(plan, options, tmp_path / "run", len(feeds), set(range(columns)), {}, None)
    try:
        for index, step in enumerate(feeds):
            recorder.before(step, 1)
            produced = production.run(None, step)
            recorder.after(index, produced, 1)
        summary = recorder.finish(len(feeds), lambda sample: 1)
    finally:
        recorder.close()
    monkeypatch.setattr(dump_module, "unblock", unblock)
    assert unblocked_where == [True] * 4 * len(feeds)
    assert summary.faithful and summary.samples_checked == len(feeds)
    assert recorder.binding.bound_steps == len(feeds) - 1
    index, found = assert_records_alone(plan, feeds, tmp_path / "run")
    for sample, alone in enumerate(found):
        with np.load(tmp_path / "run" / "dump" / "raw" / f"{sample:06d}.npz") as raw:
            assert [raw[f"t{c}"].shape for c in range(columns)] == [a.shape for a in alone]
            assert all(np.array_equal(raw[f"t{c}"], alone[c]) for c in range(columns))
    assert index["shapes"] == [[1, 20, 8, 8], [1, 12, 8, 8]]


def test_a_step_of_two_samples_records_each_as_a_step_of_one(padded, tmp_path):
    """Steps of several samples are put in NCHW and split by the worker (``DumpPlan.to_original`` then
    ``rows``): each sample's records and raw tensors equal those of steps of one sample."""
    model, inputs = padded
    runs = {}
    for batch in (1, 2):
        out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(inputs), "--dump", "--raw", "all", "--threads", "1",
                                       "--dynamic-batch", "--batch-size", str(batch), "--runs-dir", str(tmp_path),
                                       "--run-id", f"batch{batch}"])
        assert out.exit_code == 0, out.output
        runs[batch] = tmp_path / f"batch{batch}"
    indexes = {b: json.loads((run / "dump" / "index.json").read_text()) for b, run in runs.items()}
    assert [t["channels"] for t in indexes[2]["tensors"]] == [t["channels"] for t in indexes[1]["tensors"]] == [20, 20, 12, 12, 0]
    assert indexes[2]["shapes"] == indexes[1]["shapes"] == [[1, 20, 8, 8], [1, 12, 8, 8]]
    tables = {b: CompactTable("dump", lambda name, run=run: run / "dump" / "table" / name, indexes[b]["table"]["dtypes"],
                              indexes[b]["hash_function"], 4, indexes[b]["shapes"]) for b, run in runs.items()}
    for sample in range(4):
        assert tables[2].row(sample).tobytes() == tables[1].row(sample).tobytes()
        with np.load(runs[1] / "dump" / "raw" / f"{sample:06d}.npz") as one, np.load(runs[2] / "dump" / "raw" / f"{sample:06d}.npz") as two:
            assert one.files == two.files and all(np.array_equal(one[k], two[k]) for k in one.files)


def test_production_sleeps_beside_a_cpu_dump_and_spins_in_a_plain_run(padded, tmp_path, monkeypatch):
    """The production session of ``run --dump`` on the CPU lets its idle threads sleep, as the dump session does (its
    spinning threads took a core from the fingerprint worker), and the final outputs stay bit-identical to the dump's;
    a plain ``run`` keeps onnxruntime's spinning. Read from the sessions onnxruntime made."""
    from qconsist.inference import runner

    model, inputs = padded
    made: list[tuple[str, str]] = []
    create = runner.create_session

    def recording(path, options, **kwargs):
        session = create(path, options, **kwargs)
        try:
            spinning = session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # not set: onnxruntime's default, spinning
            spinning = "default"
        made.append((Path(path).name, spinning))
        return session

    monkeypatch.setattr(runner, "create_session", recording)
    for dump in (False, True):
        made.clear()
        out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(inputs), "--runs-dir", str(tmp_path),
                                       "--run-id", f"dump{dump}", "--json", *(["--dump"] if dump else [])])
        assert out.exit_code == 0, out.output
        assert made == [("padded.onnx", "0" if dump else "default")]  # production: the one session the runner makes
        if dump:
            assert json.loads(out.output)["dump"]["faithful"] is True
