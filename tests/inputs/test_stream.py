"""The streaming input pipeline: the same bytes and digests whatever the number of workers and the batch size,
errors as in one thread, borrowed steps, and the workers gone after Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from onnx_builders import build_classifier_model
from photo_files import photo
from stamped_loader import Stamped, stamps
from qconsist.cli import app
from qconsist.errors import InputError, ShapeMismatchError
from qconsist.inputs import Preprocess, open_input_set
from qconsist.inputs.digest import legacy_digest, sample_digest
from qconsist.inputs.preprocess import ChannelOrder
from qconsist.inputs import stream
from qconsist.inputs.stream import SAMPLES_PER_WORKER, resolve_workers, steps
from qconsist.store.rundir import open_run, run_state
from qconsist.store.run import Run

CAFFE = Preprocess(resize=(32, 32), crop=(24, 24), channel_order=ChannelOrder.BGR, mean=(104.0, 117.0, 123.0))


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """25 photographs of 120x90 as JPEG (decoded by the workers) in one flat folder."""
    folder = tmp_path_factory.mktemp("stream") / "jpegs"
    for n in range(25):
        photo(folder / f"{n:03d}.jpg", n, (120 + n, 90))  # 21 photographs: the sizes tell the rest apart
    return folder


def _everything(inputs, batch, workers, borrowed=False):
    steps = list((s.start, {k: v.copy() for k, v in s.arrays.items()}, s.infos)
                 for s in inputs.with_workers(workers).steps(batch, borrowed=borrowed))
    return (np.concatenate([a["x"] for _, a, _ in steps]), [i for _, _, infos in steps for i in infos],
            [start for start, _, _ in steps])


@pytest.mark.parametrize("source", ["jpegs", "augmented"])
def test_one_or_many_workers_make_the_same_bytes_and_digests(jpegs, source):
    inputs = open_input_set(jpegs if source == "jpegs" else "package:photos:augmented:25:7", CAFFE, "x")
    reference, infos, _ = _everything(inputs, 1, 0)
    assert reference.shape == (25, 3, 24, 24) and len({i.digest for i in infos}) == 25
    for batch in (1, 4, 32):
        for workers in (0, 1, 2, 3):
            for borrowed in (False, True):
                made, made_infos, starts = _everything(inputs, batch, workers, borrowed)
                assert made.tobytes() == reference.tobytes(), (batch, workers, borrowed)
                assert made_infos == infos and starts == list(range(0, 25, batch))
    digests = {inputs.with_workers(w).digest() for w in (0, 1, 3)}
    assert len(digests) == 1 and next(iter(digests)).startswith("xxh3-128:")
    assert [i.digest for i in infos] == [sample_digest(inputs.sample(n)) for n in range(25)]


def test_digest_of_a_subset_is_its_samples_digest_whatever_was_read_before(jpegs):
    inputs = open_input_set(jpegs, CAFFE, "x")
    whole = inputs.sample_infos()
    part = open_input_set(jpegs, CAFFE, "x").subset(5, 10)
    assert part.with_workers(2).sample_infos() == whole[5:15]
    assert part.digest() != inputs.digest() and part.describe()["offset"] == 5
    assert inputs.digest("sha256") == legacy_digest(inputs)


def test_run_digest_is_the_same_whatever_the_batch_size_and_workers(jpegs, tmp_path):
    model = build_classifier_model(tmp_path / "m.onnx", batch="n")
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "{jpegs}"\n')
    digests, tables = set(), set()
    for batch, workers in ((1, 0), (4, 2), (8, 3)):
        run_id = f"b{batch}w{workers}"
        result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(jpegs), "--pipeline", str(pipeline),
                                          "--batch-size", str(batch), "--workers", str(workers), "--run-id", run_id])
        assert result.exit_code == 0, result.output
        digests.add(open_run(Path("runs") / run_id).inputs["digest"])
        tables.add((Path("runs") / run_id / "inputs/samples.jsonl").read_bytes())
    assert len(digests) == 1 and len(tables) == 1
    diff = CliRunner().invoke(app, ["diff", "runs/b1w0", "runs/b8w3"])
    assert diff.exit_code == 0 and "final outputs: 0/25 samples differ" in diff.stdout


def test_a_bad_image_is_the_same_one_line_error_with_workers(tmp_path):
    folder = tmp_path / "photos"
    for n in range(12):
        photo(folder / f"{n:03d}.jpg", n)
    (folder / "007.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    (folder / "010.jpg").write_bytes(b"\xff\xd8 nor this one")
    inputs = open_input_set(folder, CAFFE, "x")
    for workers in (0, 1, 2, 3):
        with pytest.raises(InputError, match=r"^cannot read image .*/007\.jpg: cannot identify image file"):
            inputs.with_workers(workers).digest()


def test_samples_of_two_shapes_in_one_step_are_refused_in_one_line(tmp_path):
    folder = tmp_path / "sizes"
    photo(folder / "a.jpg", 0, (20, 10))
    photo(folder / "b.jpg", 1, (10, 20))
    inputs = open_input_set(folder, Preprocess(), "x")
    for workers in (0, 2):
        with pytest.raises(ShapeMismatchError, match=r"samples 0 and 1 of one step have shapes \[1, 3, 10, 20\] and "
                                                      r"\[1, 3, 20, 10\] \(input 'x'\): a step of several samples "
                                                      r"needs one shape; declare \[preprocess\] resize"):
            list(inputs.with_workers(workers).batches(2))
        shapes = [a["x"].shape for _, a in inputs.with_workers(workers).batches(1)]  # batch 1: each its own shape
        assert shapes == [(1, 3, 10, 20), (1, 3, 20, 10)]


def test_borrowed_steps_stay_readable_for_one_more_step(jpegs):
    inputs = open_input_set(jpegs, CAFFE, "x").with_workers(2)
    reference = [a["x"].copy() for _, a in inputs.with_workers(0).batches(3)]
    previous = None
    for step in inputs.steps(3, borrowed=True):
        if previous is not None:
            np.testing.assert_array_equal(previous.arrays["x"], reference[previous.start // 3])
        np.testing.assert_array_equal(step.arrays["x"], reference[step.start // 3])
        previous = step


def _stamped_after(folder, wanted, seconds=60.0):
    """The samples the workers have prepared, once they are ``wanted`` (or the deadline passes)."""
    deadline = time.monotonic() + seconds
    while stamps(folder) != wanted and time.monotonic() < deadline:
        time.sleep(0.02)
    return stamps(folder)


def test_workers_prepare_the_steps_ahead_while_the_consumer_is_busy(jpegs, tmp_path):
    """The workers are fed by a thread of their own: before the first step is asked for (a run creates its
    sessions meanwhile) and while the consumer holds a step (a run is inside the session), they prepare every
    step the ring has room for, and not one more (the slots the consumer may still read). Before, chunks were
    handed out only while the consumer waited for a step: nothing was prepared before the first was asked for."""
    inputs = open_input_set(jpegs, CAFFE, "x")
    reference = [a["x"].copy() for _, a in inputs.with_workers(0).batches(1)]
    folder = tmp_path / "stamps"
    folder.mkdir()
    # 2 workers, steps of 1 sample: 4 chunks of 1 a worker in flight (stream.AHEAD) + the 2 steps the consumer may
    # hold = 10 slots; borrowed, the consumer asking for step n may still read step n - 1: steps up to n + 8 are made
    slots = 10
    made = steps(Stamped(inputs._load, folder), 25, 1, 2, borrowed=True)
    try:
        ahead = set(range(slots - 1))
        assert _stamped_after(folder, ahead) == ahead  # nothing asked for yet
        time.sleep(0.5)
        assert stamps(folder) == ahead  # not one more until step 1 is asked for
        first = next(made)
        second = next(made)  # step 1 asked for (step 0 stays readable): room for one more, made while it is held
        assert _stamped_after(folder, set(range(slots))) == set(range(slots))
        time.sleep(0.5)
        assert stamps(folder) == set(range(slots))
        np.testing.assert_array_equal(first.arrays["x"], reference[0])  # still readable: not overwritten
        np.testing.assert_array_equal(second.arrays["x"], reference[1])
        rest = [step.arrays["x"].copy() for step in made]
        assert len(rest) == 23 and all((a == b).all() for a, b in zip(rest, reference[2:]))
        assert stamps(folder) == set(range(25))
    finally:
        made.close()


def test_with_worker_processes_the_main_process_digests_no_sample(jpegs, monkeypatch):
    """Every sample's digest and its file's are made where the sample is decoded: with worker processes, never in
    the main process (its thread runs the session); the same digests as one thread makes."""
    inputs = open_input_set(jpegs, CAFFE, "x")
    reference = inputs.with_workers(0).sample_infos()
    made_here = []
    for name in ("sample_digest", "file_digest"):
        original = getattr(stream, name)
        monkeypatch.setattr(stream, name, lambda *args, _original=original, _name=name: made_here.append(_name) or _original(*args))
    infos = [info for step in inputs.with_workers(2).steps(4, borrowed=True) for info in step.infos]
    assert made_here == []
    assert infos == reference


def test_resolve_workers():
    cores = len(os.sched_getaffinity(0))
    assert resolve_workers(None, 10, True) == 1  # a small set: one thread, no process to start
    assert resolve_workers(None, SAMPLES_PER_WORKER * 1000, True) == cores
    assert resolve_workers(None, 10**6, False) == 1 and resolve_workers(5, 10**6, False) == 1
    assert resolve_workers(0, 10, True) == 0 and resolve_workers(7, 10, True) == 7
    from qconsist.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^workers must be a whole number >= 0, got -1$"):
        resolve_workers(-1, 10, True)


def _old_layout(run: Path, inputs) -> None:
    """Rewrite a run as qconsist 0.1 wrote it: names in the manifest, a sha256 digest, no sample table."""
    manifest = json.loads((run / "manifest.json").read_text())
    recorded = manifest["inputs"]
    recorded.update(names=list(inputs.names), digest=inputs.digest("sha256"))
    for key in ("samples", "offset"):
        recorded.pop(key)
    manifest["files"].pop("inputs/samples.jsonl")
    (run / "inputs" / "samples.jsonl").unlink()
    (run / "inputs").rmdir()
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_old_layout_runs_stay_readable_and_diffable(jpegs, tmp_path):
    """A run recorded with a sha256 digest is not 'a different input set': diff compares it with a new run by
    its sample names (and says so), and a different set is still refused."""
    model = build_classifier_model(tmp_path / "m.onnx")
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "{jpegs}"\n')
    for run_id, extra in (("old", []), ("new", []), ("other", ["--offset", "1"])):
        result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(jpegs), "--pipeline", str(pipeline),
                                          "--count", "6", "--dump", "--run-id", run_id, *extra])
        assert result.exit_code == 0, result.output
    from qconsist.inference.session import input_specs

    old_inputs = open_input_set(jpegs, Preprocess(resize=(8, 8)), "x").subset(0, 6).checked(input_specs(model))
    _old_layout(Path("runs/old"), old_inputs)
    assert run_state(Path("runs/old")) == "complete"
    assert CliRunner().invoke(app, ["verify", "runs/old"]).exit_code == 0
    result = CliRunner().invoke(app, ["diff", "runs/old", "runs/new"])
    assert result.exit_code == 0, result.output
    assert ("note: the runs record sha256 and xxh3-128 input digests (one was written before qconsist 0.2): their 6 "
            "sample names agree, their bytes were not compared") in result.stdout
    assert "verdict: identical" in result.stdout
    refused = CliRunner().invoke(app, ["diff", "runs/old", "runs/other"])
    assert refused.exit_code == 2
    assert refused.stderr == (f"error: runs on different input sets ({jpegs} ×6 vs {jpegs} ×6: their sample names "
                              "differ); compare runs on the same inputs\n")
    from qconsist.explain.replay import replay_inputs

    replayed, where = replay_inputs(Run.open("runs/old"), model)
    assert where == (0, 6) and replayed.digest("sha256") == old_inputs.digest("sha256")
    replayed, where = replay_inputs(Run.open("runs/other"), model)
    assert where == (1, 6) and replayed.digest() == open_run(Path("runs/other")).inputs["digest"]


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (its children, theirs…), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _stage(marker: Path) -> str | None:
    try:
        return json.loads(marker.read_text()).get("stage")
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_during_a_parallel_run_leaves_it_incomplete_and_no_workers(tmp_path):
    """SIGINT to `qconsist run --workers 2` while its workers decode: exit 130, the run incomplete (as a kill
    leaves it), and none of the worker processes left running."""
    folder = tmp_path / "many"
    folder.mkdir()
    sources = [photo(tmp_path / "src" / f"{n}.jpg", n, (500, 375)) for n in range(7)]
    for n in range(3000):  # hard links: 3,000 files to decode, 7 files of disk
        os.link(sources[n % 7], folder / f"{n:05d}.jpg")
    model = build_classifier_model(tmp_path / "m.onnx")
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "{folder}"\n')
    runs = tmp_path / "runs"
    qconsist = str(Path(sys.executable).parent / "qconsist")
    process = subprocess.Popen([qconsist, "run", str(model), "--inputs", str(folder), "--pipeline", str(pipeline),
                                "--workers", "2", "--runs-dir", str(runs), "--run-id", "cut"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker, workers = runs / "cut" / "RUNNING.json", set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        workers |= _descendants(process.pid)
        if len(workers) >= 2 and _stage(marker) == "inference":  # the steps are under way
            break
        time.sleep(0.02)
    assert process.poll() is None, f"finished before the signal: {process.communicate()}"
    assert len(workers) >= 2, "the input workers were never seen"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    said = err.splitlines()  # piped: a progress line every 10 s of work may come first
    assert process.returncode == 130 and said[-1] == "error: interrupted" and out == ""
    assert all(line.startswith("progress ") for line in said[:-1]), err
    assert run_state(runs / "cut") == "incomplete"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.05)
    assert [p for p in workers if _alive(p)] == []
    assert [p for p in Path("/dev/shm").iterdir() if p.name.startswith("qconsist-inputs-")] == []
