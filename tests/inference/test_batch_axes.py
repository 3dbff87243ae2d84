"""Batch axes from the graph (issue 27 items 3, 4, 10; issue 29 item 10): a step of several samples is recorded
sample by sample along each tensor's own batch axis, as a step of one sample computes it; shape tensors that
carry N are recorded for one sample; a tensor no sample owns a part of is reported, never sliced; every input a
model takes can be fed exactly (a folder of ``.npz`` files); sequence outputs and onnxruntime's failures are
refused in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from batch_models import sample_rate_model, save_feeds, shape_transpose_flatten_model, state_model
from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set
from qconsist.store.rundir import open_run


def _run(model, inputs, tmp_path, run_id, level="all", dump=True, **request):
    opened = open_input_set(inputs, None, "x")
    options = ExecutionOptions(graph_optimization_level=level)
    return run_inference(resolve_model(model), opened, RunRequest(options, dump=dump, **request),
                         tmp_path / "runs", run_id=run_id)


def _outputs(run_dir, index):
    return np.load(run_dir / "outputs" / f"o{index}.npy")


def _index(run_dir):
    return json.loads((run_dir / "dump" / "index.json").read_text())


def _splits(run_dir):
    index = _index(run_dir)
    return {t["name"]: s for t, s in zip(index["tensors"], index["splits"])}


def test_batch_1_and_2_agree_where_shape_tensors_carry_n_and_the_batch_moves(tmp_path):
    """Item 3: Shape/Gather carry N, a Transpose moves the batch to axis 1, a Flatten(axis=0) merges it: the
    runs agree, tensor by tensor, and each tensor's split is recorded."""
    model = shape_transpose_flatten_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(3).normal(size=(6, 3, 8, 8)).astype(np.float32))
    one = _run(model, tmp_path / "x.npy", tmp_path, "one", level="disable")
    two = _run(model, tmp_path / "x.npy", tmp_path, "two", level="disable", batch_size=2)
    assert one.dump.faithful and two.dump.faithful
    result = diff_runs(one.run_dir, two.run_dir)
    assert [n.label for n in result.tensors.nodes] == [] and result.passed
    assert result.tensors.compared == 12 and result.tensors.samples == 6
    splits = _splits(two.run_dir)
    assert splits["shape"] == {"kind": "shape", "positions": [0]}
    assert splits["n"] == {"kind": "shape", "positions": [0]}
    assert splits["moved"] == {"kind": "axis", "axis": 1, "size": 1}
    assert splits["flat"] == {"kind": "axis", "axis": 1, "size": 256}
    assert splits["y"] == {"kind": "axis", "axis": 0, "size": 1}
    np.testing.assert_array_equal(_outputs(one.run_dir, 0), _outputs(two.run_dir, 0))


def test_a_restamped_model_at_batch_2_agrees_with_batch_1(tmp_path):
    """Item 3 as reported: a model fixed at batch 1, re-stamped (`dynamic_batch`), at level all."""
    model = shape_transpose_flatten_model(tmp_path / "m.onnx", batch=1)
    np.save(tmp_path / "x.npy", np.random.default_rng(5).normal(size=(4, 3, 8, 8)).astype(np.float32))
    one = _run(model, tmp_path / "x.npy", tmp_path, "one")
    two = _run(model, tmp_path / "x.npy", tmp_path, "two", batch_size=2, dynamic_batch=True)
    result = diff_runs(one.run_dir, two.run_dir)
    assert [n.label for n in result.tensors.nodes] == [] and result.passed
    np.testing.assert_array_equal(_outputs(one.run_dir, 0), _outputs(two.run_dir, 0))


@pytest.mark.parametrize("dump", [False, True])
def test_a_state_output_is_split_on_its_batch_axis_1(tmp_path, dump):
    """Item 4: the state [2, B, 128] of each sample is [2, 1, 128] at batch 2 as at batch 1 (it was axis 0)."""
    model = state_model(tmp_path / "state.onnx")
    x = np.random.default_rng(8).normal(size=(5, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    one = _run(model, tmp_path / "x.npy", tmp_path, "one", dump=dump)
    two = _run(model, tmp_path / "x.npy", tmp_path, "two", dump=dump, batch_size=2)
    state = _outputs(two.run_dir, 1)
    assert state.shape == (5, 2, 1, 128)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for i in range(5):
        np.testing.assert_array_equal(state[i], session.run(["state"], {"x": x[i:i + 1]})[0])
    np.testing.assert_array_equal(_outputs(one.run_dir, 1), state)
    result = diff_runs(one.run_dir, two.run_dir)
    assert result.passed and result.outputs.samples == 5
    if dump:
        assert _splits(two.run_dir)["state"] == {"kind": "axis", "axis": 1, "size": 1}


def test_a_state_input_with_batch_axis_1_is_fed_and_stacked_on_it(tmp_path):
    """Item 10: samples of a folder of .npz files are fed as they are ([2, 1, 128] state, [1, 16] x) and a step
    of 2 stacks the state on axis 1, the axis its graph names B."""
    model = state_model(tmp_path / "state.onnx", state_input=True)
    rng = np.random.default_rng(9)
    samples = [{"x": rng.normal(size=(1, 16)).astype(np.float32),
                "state_in": rng.normal(size=(2, 1, 128)).astype(np.float32)} for _ in range(3)]
    feeds = save_feeds(tmp_path / "feeds", samples)
    one = _run(model, feeds, tmp_path, "one")
    two = _run(model, feeds, tmp_path, "two", batch_size=2)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for run in (one, two):
        assert run.dump.faithful
        for i, sample in enumerate(samples):
            y, state = session.run(None, sample)
            np.testing.assert_array_equal(_outputs(run.run_dir, 0)[i], y)
            np.testing.assert_array_equal(_outputs(run.run_dir, 1)[i], state)
    assert diff_runs(one.run_dir, two.run_dir).passed
    assert open_run(two.run_dir).inputs["kind"] == "arrays"


def test_a_rank_0_int64_input_is_fed_as_it_is(tmp_path):
    model = sample_rate_model(tmp_path / "sr.onnx")
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(size=(1, 16)).astype(np.float32), "sr": np.array(rate, np.int64)}
               for rate in (8000, 16000, 22050)]
    feeds = save_feeds(tmp_path / "feeds", samples)
    result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(feeds), "--dump", "--runs-dir",
                                      str(tmp_path / "runs"), "--run-id", "sr"])
    assert result.exit_code == 0, result.output
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(_outputs(tmp_path / "runs" / "sr", 0)[i], session.run(None, sample)[0])
    assert open_run(tmp_path / "runs" / "sr").sections["dump"]["faithful"]
    refused = CliRunner().invoke(app, ["run", str(model), "--inputs", str(feeds), "--batch-size", "2",
                                       "--runs-dir", str(tmp_path / "runs")])
    assert refused.exit_code == 2
    assert refused.stderr == ("error: model input 'x' has a fixed batch dimension of 1; --batch-size 2 needs a dynamic "
                              "one: convert with [convert] dynamic_batch = true, or re-stamp the model with --dynamic-batch\n")


def _save(nodes, inputs, outputs, path, inits=(), opset=17):
    model = helper.make_model(helper.make_graph(nodes, path.stem, inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_output_that_mixes_the_samples_of_a_step_is_refused_never_sliced(tmp_path):
    """y = ReduceSum over the batch: no sample owns a part of it; at batch 2 it was recorded whole for each."""
    path = _save([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], tmp_path / "mix.onnx",
                 [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    np.save(tmp_path / "x.npy", np.random.default_rng(2).normal(size=(4, 16)).astype(np.float32))
    for dump in (["--dump"], []):
        result = CliRunner().invoke(app, ["run", str(path), "--inputs", str(tmp_path / "x.npy"), "--batch-size", "2",
                                          *dump, "--runs-dir", str(tmp_path / "runs")])
        assert result.exit_code == 2, result.output
        assert result.stderr == ("error: output 'y' cannot be split into the samples of a step (it mixes the samples of "
                                 "a step); run with --batch-size 1\n")


def test_a_tensor_without_a_batch_axis_is_left_out_and_reported(tmp_path):
    """An intermediate that mixes the samples (the step's mean) is left out of the dump at batch 2, said in
    ``left_out``; the per-sample tensors are compared and agree with batch 1 (``nothing``, zero whatever the
    step, is every sample's)."""
    path = _save([helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
                  helper.make_node("Mul", ["mean", "zero"], ["nothing"]),
                  helper.make_node("Add", ["x", "nothing"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], tmp_path / "mean.onnx",
                 [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    np.save(tmp_path / "x.npy", np.random.default_rng(2).normal(size=(4, 16)).astype(np.float32))
    one = _run(path, tmp_path / "x.npy", tmp_path, "one", level="disable")
    two = _run(path, tmp_path / "x.npy", tmp_path, "two", level="disable", batch_size=2)
    index = _index(two.run_dir)
    assert index["left_out"] == {"mean": "no batch axis: it mixes the samples of a step"}
    assert [t["name"] for t in index["tensors"]] == ["nothing", "y"]
    assert index["splits"] == [{"kind": "shared"}, {"kind": "axis", "axis": 0, "size": 1}]
    assert diff_runs(one.run_dir, two.run_dir).passed


def test_a_sequence_output_is_refused_in_one_line_and_a_sequence_inside_is_left_out(tmp_path):
    seq = _save([helper.make_node("SequenceConstruct", ["x", "x"], ["s"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)], tmp_path / "seq.onnx")
    inner = _save([helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
                   helper.make_node("SequenceAt", ["s", "one"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], tmp_path / "inner.onnx",
                  [numpy_helper.from_array(np.array(1, np.int64), "one")])
    np.save(tmp_path / "x.npy", np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32))
    runner = CliRunner()
    for batch in ("1", "3"):
        result = runner.invoke(app, ["run", str(seq), "--inputs", str(tmp_path / "x.npy"), "--dump", "--batch-size", batch,
                                     "--dynamic-batch", "--runs-dir", str(tmp_path / "runs")])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: model ") and result.stderr.endswith(
            "seq.onnx: output 's' is seq(tensor(float)), not a tensor; qconsist records tensors\n")
    result = runner.invoke(app, ["run", str(inner), "--inputs", str(tmp_path / "x.npy"), "--dump", "--runs-dir",
                                 str(tmp_path / "runs"), "--run-id", "inner"])
    assert result.exit_code == 0, result.output
    assert _index(tmp_path / "runs" / "inner")["left_out"] == {"s": "not a tensor (seq(tensor(float)))"}


def test_onnxruntime_failing_on_the_model_is_the_models_failure(tmp_path):
    """A Reshape to [4, -1] of 6 elements loads, then fails in onnxruntime: exit 2 naming the sample."""
    path = _save([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], tmp_path / "bad.onnx",
                 [numpy_helper.from_array(np.array([4, -1], np.int64), "shape")])
    np.save(tmp_path / "x.npy", np.zeros((2, 6), np.float32))
    result = CliRunner().invoke(app, ["run", str(path), "--inputs", str(tmp_path / "x.npy"), "--runs-dir",
                                      str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: onnxruntime cannot run model {path} on sample 0: ")
    assert "internal error" not in result.output
    dumped = CliRunner().invoke(app, ["run", str(path), "--inputs", str(tmp_path / "x.npy"), "--dump", "--runs-dir",
                                      str(tmp_path / "runs")])
    assert dumped.exit_code == 2, dumped.output
    assert dumped.stderr.startswith("error: onnxruntime cannot run the model (its dumped graph): ")
    assert len(dumped.stderr.splitlines()) == 1


def test_classify_never_takes_a_coincidence_of_shapes_for_a_batch_axis():
    """Two samples whose step interleaves them (a batch merged under another axis) are not split, though the
    step's extent is twice a sample's; [1, 1] -> [2, 2] (an outer product of the batch) is no batch axis either."""
    from qconsist.inference.batch import Split, classify

    one, other = np.arange(12, dtype=np.float32), np.arange(12, dtype=np.float32) + 100
    interleaved = np.stack([one, other], axis=1).reshape(-1)
    assert classify(one, other, interleaved) == Split("unknown", why="no axis holds the samples one after the other")
    assert classify(one, other, np.concatenate([one, other])) == Split("axis", 0, 12)
    assert classify(np.ones((1, 1)), np.ones((1, 1)), np.ones((2, 2))) == Split(
        "unknown", why="no axis holds the samples one after the other")
    shape = np.array([1, 3, 8, 8], np.int64)
    assert classify(shape, shape, np.array([2, 3, 8, 8], np.int64)) == Split("shape", positions=(0,))
    assert classify(shape, shape, shape) == Split("shared")
    assert classify(np.array([1, 3], np.int64), np.array([1, 4], np.int64), np.array([2, 7], np.int64)).kind == "unknown"
    assert Split("shape", positions=(0,)).rows(np.array([4, 3, 8, 8], np.int64), 4)[3].tolist() == [1, 3, 8, 8]
    state = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    rows = Split("axis", 1, 1).rows(state, 3)
    assert [r.shape for r in rows] == [(2, 1, 4)] * 3 and rows[2].tolist() == state[:, 2:3].tolist()


def test_a_quantized_output_a_quantum_off_in_a_step_of_two_still_has_its_batch_axis():
    """On the CUDA EP a step of two runs other convolution algorithms than a step of one, and a last-bit change
    before a QuantizeLinear moves open_nsfw QDQ's class scores by one int8 quantum (1/255): measured on an H200,
    the probe then found no batch axis for `prob` and refused every --batch-size 32 run. Each half nearer its own
    sample than the other is the batch axis; swapped or mixed halves, or a gap of more than a few quanta, are not."""
    from qconsist.inference.batch import Split, classify

    one, other = np.array([[0.99608, 0.00392]], np.float32), np.array([[0.2, 0.8]], np.float32)
    quantum = np.float32(1 / 255)
    step = np.concatenate([one + [[-quantum, quantum]], other])
    assert classify(one, other, step) == Split("axis", 0, 1)
    assert classify(one, other, step[::-1]).kind == "unknown"  # swapped: sample 1 first
    assert classify(one, other, np.concatenate([one + [[-0.1, 0.1]], other])).kind == "unknown"  # 25 quanta off
    near = np.array([[0.99608, 0.00392]], np.float32) + [[-quantum, quantum]]  # two samples a quantum apart:
    assert classify(one, near.astype(np.float32), np.concatenate([near, one]).astype(np.float32)).kind == "unknown"


class _OtherKernelsForTwo:
    """A session whose step of two samples computes sample 0's scores 0.05 off (as an EP with other kernels for
    another step size may, more than the probe can tell from the samples themselves)."""

    def __init__(self, session):
        self._session = session

    def __getattr__(self, name):
        return getattr(self._session, name)

    def run(self, names, feed, *args):
        outputs = self._session.run(names, feed, *args)
        if next(iter(feed.values())).shape[0] == 2:
            outputs = [o.copy() for o in outputs]
            outputs[0][0, 0] += np.float32(0.05)
        return outputs


def test_the_outputs_batch_axis_is_the_graphs_whatever_the_run_s_ep_computes_for_a_step_of_two(tmp_path, monkeypatch):
    """The model's outputs are probed on the CPU with the graph unoptimized (one definition: the graph decides
    where a sample's part lies): the run's own session moving a step of two by more than a few quanta no longer
    refuses the run (measured on an H200: every open_nsfw QDQ --batch-size 32 run on the CUDA EP was refused)."""
    from onnx_builders import build_classifier_model, save_arrays
    import qconsist.inference.runner as runner

    model = build_classifier_model(tmp_path / "m.onnx", batch="N")
    data = save_arrays(tmp_path / "x.npy", 4, seed=3)
    real = runner.create_session
    monkeypatch.setattr(runner, "create_session", lambda path, options=ExecutionOptions(), **kw: (
        real(path, options, **kw) if kw.get("level") is not None else _OtherKernelsForTwo(real(path, options, **kw))))
    result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(data), "--batch-size", "2", "--run-id", "r",
                                      "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    run = open_run(tmp_path / "runs" / "r")
    assert run.sections["inference"]["samples"] == 4


def test_a_batch_fixed_at_the_step_size_runs_unprobed_split_on_its_first_axis(tmp_path):
    """A model fixed at batch 4 cannot run the probe's steps of 1 and 2: at --batch-size 4 its tensors are split
    by their first axis (kind ``first``, as before the probe) and its outputs are onnxruntime's."""
    from batch_models import fixed_batch_model

    model = fixed_batch_model(tmp_path / "fixed4.onnx", batch=4)
    x = np.random.default_rng(12).normal(size=(8, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    run = _run(model, tmp_path / "x.npy", tmp_path, "four", batch_size=4)
    assert run.dump.faithful
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = np.concatenate([session.run(None, {"x": x[:4]})[0], session.run(None, {"x": x[4:]})[0]])
    np.testing.assert_array_equal(_outputs(run.run_dir, 0)[:, 0], expected)
    assert set(s["kind"] for s in _index(run.run_dir)["splits"]) == {"first"}


def test_the_exact_form_feeds_nan_and_inf_as_values_the_stacked_form_refuses_them(tmp_path):
    model = sample_rate_model(tmp_path / "sr.onnx")
    x = np.array([[np.nan, np.inf, -np.inf, 1.0] * 4], np.float32)
    feeds = save_feeds(tmp_path / "feeds", [{"x": x, "sr": np.array(16000, np.int64)}])
    result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(feeds), "--dump", "--runs-dir",
                                      str(tmp_path / "runs"), "--run-id", "nan"])
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(_outputs(tmp_path / "runs" / "nan", 0)[0], x)  # NaN where NaN
    assert open_run(tmp_path / "runs" / "nan").inputs["exact"] is True
    from qconsist.errors import InputError
    from qconsist.inference.session import input_specs
    from qconsist.inputs.loaders import check_sample

    with pytest.raises(InputError, match=r"^sample 7: input 'x' holds 4 NaN and 8 infinite value\(s\); every input must be finite$"):
        check_sample({"x": x, "sr": np.array(16000, np.int64)}, input_specs(model), "7")  # any other form


def test_a_state_whose_batch_axis_the_graph_does_not_name_refuses_a_step_of_several(tmp_path):
    """state [2, ?, 128] with an unnamed free axis (silero_vad's): axis 0 is not its batch though a step of 2
    would match it; refused in one line, never stacked on axis 0."""
    nodes = [helper.make_node("ReduceSum", ["state", "axes"], ["s"], keepdims=0),
             helper.make_node("Add", ["x", "s"], ["y"])]
    path = _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 128]),
                         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, None, 128])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 128])], tmp_path / "unnamed.onnx",
                 [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    rng = np.random.default_rng(3)
    feeds = save_feeds(tmp_path / "feeds", [{"x": rng.normal(size=(1, 128)).astype(np.float32),
                                             "state": rng.normal(size=(2, 1, 128)).astype(np.float32)} for _ in range(4)])
    result = CliRunner().invoke(app, ["run", str(path), "--inputs", str(feeds), "--batch-size", "2", "--runs-dir",
                                      str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert result.stderr == ("error: model input 'state' (shape [2, ?, 128]) has no batch axis its graph names; "
                             "--batch-size 2 stacks samples on it: run with --batch-size 1\n")
    one = CliRunner().invoke(app, ["run", str(path), "--inputs", str(feeds), "--dump", "--runs-dir", str(tmp_path / "runs")])
    assert one.exit_code == 0, one.output


def test_a_step_of_two_on_other_kernels_keeps_its_batch_axis_where_swapping_the_samples_swaps_the_halves():
    """Where an EP runs other kernels for a step of two (the CUDA EP picks its convolution algorithms by the step's
    shape), a quantized model's int8 tensors come a few quanta off the samples alone and its float tensors by more
    than a few quanta of the output: the step of the two samples in the other order, on the same kernels, holds
    the same halves swapped bit for bit, which establishes the batch axis. Halves that do not swap exactly, are
    equal, or are nearer the other sample than their own are not a batch axis."""
    from qconsist.inference.batch import Split, classify

    rng = np.random.default_rng(5)
    one, other = rng.integers(-100, 100, (1, 4, 3, 3)).astype(np.int8), rng.integers(-100, 100, (1, 4, 3, 3)).astype(np.int8)
    shift = np.int8(3)  # three quanta everywhere in a step of two
    both, swapped = np.concatenate([one + shift, other + shift]), np.concatenate([other + shift, one + shift])
    assert classify(one, other, both).kind == "unknown"  # three quanta: no batch axis without the swapped step
    assert classify(one, other, both, swapped) == Split("axis", 0, 1)
    moved = swapped.copy()
    moved[0, 0, 0, 0] += 1  # one value of the swapped step not its half: other kernels for another position
    assert classify(one, other, both, moved).kind == "unknown"
    assert classify(one, other, swapped, both).kind == "unknown"  # the halves nearer the other sample: mixed
    same = np.concatenate([one + shift, one + shift])
    assert classify(one, one, same, same).kind == "unknown"  # equal halves tell nothing, three quanta off
    floats = rng.normal(size=(1, 6)).astype(np.float32), rng.normal(size=(1, 6)).astype(np.float32)
    off = [f + np.float32(0.1) for f in floats]  # 0.1 off: more than a few quanta of the output
    assert classify(*floats, np.concatenate(off)).kind == "unknown"
    assert classify(*floats, np.concatenate(off), np.concatenate(off[::-1])) == Split("axis", 0, 1)


def _qdq_model(path):
    """Conv -> QuantizeLinear -> DequantizeLinear -> GlobalAveragePool -> Flatten, batch free: float and int8
    tensors, as a quantized model's."""
    weight = numpy_helper.from_array(np.random.default_rng(7).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("GlobalAveragePool", ["d"], ["g"]),
             helper.make_node("Flatten", ["g"], ["y"])]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], path, [weight, scale, zero])


def _other_kernels_for_two(outputs, how):
    """A step of two's tensors as other kernels for that step size compute them: every tensor of every sample moved
    alike (``alike``: the same for every position of the batch, as an EP's kernels for another step size) or only
    sample 0's (``first``): int tensors by three quanta, float ones by 0.1."""
    moved = []
    for o in outputs:
        o = np.array(o)
        part = slice(0, 2 if how == "alike" else 1)
        if o.ndim and o.shape[0] == 2 and o.dtype.kind in "iu":
            o[part] = np.clip(o[part].astype(np.int64) + 3, np.iinfo(o.dtype).min, np.iinfo(o.dtype).max)
        elif o.ndim and o.shape[0] == 2 and o.dtype.kind == "f":
            o[part] += np.float32(0.1)
        moved.append(o)
    return moved


@pytest.mark.parametrize("how", ["alike", "first"])
def test_the_dump_keeps_every_tensor_where_a_step_of_two_runs_other_kernels_for_every_sample_alike(tmp_path, monkeypatch, how):
    """Measured on an H200: the dump of open_nsfw QDQ at --batch-size 32 on the CUDA EP left 231 of its 416 tensors
    out ("their batch axis cannot be established"), its step of two running other convolution algorithms than a
    step of one. A dump session whose step of two moves every sample's tensors alike keeps every tensor (each
    split on axis 0) and its records equal a run at batch 1 (here only the probe's view is moved); one that
    moves only sample 0's leaves the moved tensors out, as before."""
    import qconsist.inference.dump as dump

    model = _qdq_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(3).normal(size=(4, 3, 8, 8)).astype(np.float32))
    real = dump.probe_splits

    def moved(outputs, feed):
        return _other_kernels_for_two(outputs, how) if next(iter(feed.values())).shape[0] == 2 else outputs

    def probe(run, first, second, stack, what, more=None, run_columns=None):  # the dump session's steps of two, as
        # the probe sees them (the further pairs' tensors too)
        return real(lambda feed: moved(run(feed), feed), first, second, stack, what, more,
                    None if run_columns is None else lambda feed, columns: moved(run_columns(feed, columns), feed))

    monkeypatch.setattr(dump, "probe_splits", probe)
    two = _run(model, tmp_path / "x.npy", tmp_path, "two", level="disable", batch_size=2)
    index = _index(two.run_dir)
    if how == "first":
        assert sorted(index["left_out"]) == ["g", "q"]  # c and d: 0.1 is within a few quanta of their magnitude (`_apart`)
        assert all(why.startswith("no batch axis: ") for why in index["left_out"].values())
        return
    assert two.dump.faithful and index["left_out"] == {}
    assert {name: split["kind"] for name, split in _splits(two.run_dir).items()} == dict.fromkeys("cdgqy", "axis")
    monkeypatch.setattr(dump, "probe_splits", real)
    one = _run(model, tmp_path / "x.npy", tmp_path, "one", level="disable")
    result = diff_runs(one.run_dir, two.run_dir)
    assert result.passed and result.tensors.compared == 5 and [n.label for n in result.tensors.nodes] == []


def test_a_tensor_two_near_samples_cannot_place_is_placed_by_a_further_sample():
    """Measured on an H200: a CUDA dump of open_nsfw QDQ at --batch-size 32 left one tensor out,
    prob_QuantizeLinear_Input (the Softmax before the last QuantizeLinear): "no axis holds the samples one after
    the other". Samples 0 and 1 of the photograph folder give it [0.9862, 0.0138] and [0.9876, 0.0124] (0.0014
    apart, on the CPU here), and the step of two's kernels move it as far, so neither half is nearer its own
    sample. A further sample ([0.899, 0.101]) tells the halves apart and places it on axis 0; a tensor that mixes
    the samples stays unknown whatever the pair, and says how many samples were tried."""
    from qconsist.inference.batch import NO_AXIS, Split, probe_splits

    s0, s1, s2 = ({"x": np.array([v], np.float32)} for v in ([0.9862, 0.0138], [0.9876, 0.0124], [0.899, 0.101]))

    def run(feed):  # a step of two moves its first position by 0.002 (other kernels): no bit-for-bit swap either
        x = feed["x"].copy()
        if len(x) == 2:
            x[0] += np.float32([-0.002, 0.002])
        return [x, np.broadcast_to(x.mean(axis=0, keepdims=True), x.shape).copy()]

    stack = lambda samples: {"x": np.concatenate([s["x"] for s in samples])}  # noqa: E731
    alone = probe_splits(run, s0, s1, stack, "t")
    assert [s.kind for s in alone] == ["unknown", "unknown"] and alone[0].why == NO_AXIS
    asked = []

    def more():
        for sample in (s2, s1):
            asked.append(sample)
            yield sample

    placed = probe_splits(run, s0, s1, stack, "t", more)
    assert placed[0] == Split("axis", 0, 1)
    assert placed[1].kind == "unknown" and placed[1].why == f"{NO_AXIS} (nor with 3 other samples)"
    assert len(asked) == 2  # read one at a time while a tensor is still open
    assert probe_splits(run, s0, s2, stack, "t", more)[0] == Split("axis", 0, 1)
    fetched = []

    def run_columns(feed, columns):  # the further pairs fetch the open tensors alone
        fetched.append(list(columns))
        outputs = run(feed)
        return [outputs[c] for c in columns]

    asked.clear()
    assert probe_splits(run, s0, s1, stack, "t", more, run_columns) == placed
    assert fetched == [[0, 1]] * 3 + [[1]] * 3  # both open after the first pair; the mixing one alone after s2


def test_further_samples_are_the_same_ones_every_time_and_differ_from_the_first():
    from qconsist.inference.batch import further_samples

    data = [{"x": np.full((1, 2), i // 2, np.float32)} for i in range(40)]  # samples 2k and 2k+1 equal
    read = []

    def sample(i):
        read.append(i)
        return data[i]

    more = further_samples(sample, 40, data[20])  # the middle one equals the first: skipped
    first = [int(s["x"][0, 0]) for s in more()]
    again = [int(s["x"][0, 0]) for s in more()]
    assert first == again == [19, 5, 15] and read == [20, 39, 10, 30, 20, 39, 10, 30]
    assert list(further_samples(sample, 2, data[0])()) == []  # two samples: none further
