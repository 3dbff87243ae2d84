"""NCHWc-blocked tensors (onnxruntime's NchwcTransformer on the CPU EP: channel blocks of 16 under AVX-512F, of 8
under AVX2) recorded in NCHW without their padding channels and compared by value across instruction sets.

Models built in code (``nchwc_models.py``: integer weights and inputs, every sum exact in float32, so any processor
computes the same bits); real emulation (``qemu-x86_64 -cpu Haswell``) for the other block size; open_nsfw QDQ under
the pin for the real case. ``tests/data/old_runs/nchwc-aligned`` is a dump of ``aligned_model`` on
``integer_inputs(…, 16)`` written by qconsist at ca8bc3b (before the blocks were recorded), on an AVX-512 machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from nchwc_models import aligned_model, aligned_weights, conv, integer_inputs, padded_model, padded_weights
from qconsist.cli import app
from qconsist.cpu import instruction_set
from qconsist.diff import tensors as diff_tensors
from qconsist.inference import layout

NATIVE_BLOCK = 16 if "NCHWc 16" in instruction_set().float_kernels else 8
OLD_RUN = Path(__file__).resolve().parents[1] / "data" / "old_runs" / "nchwc-aligned"
OPEN_NSFW = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml"
# each NCHWc Conv of ORT's graph (named after the original output it computes) and the original filter it holds
FILTERS = {"aligned": {"relu1_nchwc": "w1", "y_nchwc": "w2"},
           "padded": {"relu1_nchwc": "w1", "conv3_nchwc": "w3", "conv2_nchwc": "w2"}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nchwc")
    return {"aligned": aligned_model(folder / "aligned.onnx"), "aligned_inputs": integer_inputs(folder / "aligned.npy", 16),
            "padded": padded_model(folder / "padded.onnx"), "padded_inputs": integer_inputs(folder / "padded.npz", 20),
            "folder": folder}


def _run(model: Path, inputs: Path | str, runs: Path, run_id: str, *extra: str, raw: str = "all") -> Path:
    out = CliRunner().invoke(app, ["run", str(model), "--inputs", str(inputs), "--dump", "--raw", raw, "--threads", "1",
                                   "--runs-dir", str(runs), "--run-id", run_id, *extra])
    assert out.exit_code == 0, out.output
    return runs / run_id


def _index(run: Path) -> dict:
    return json.loads((run / "dump" / "index.json").read_text())


def test_the_block_is_measured_from_onnxruntime():
    # AVX-512F: blocks of 16 (MlasNchwcGetBlockSize); FMA3, AVX, SSE: 8
    assert layout.block_size() == NATIVE_BLOCK


def test_blocked_tensors_are_recorded_in_nchw_without_their_padding_channels(models, tmp_path):
    run = _run(models["padded"], models["padded_inputs"], tmp_path, "padded")
    index = _index(run)
    assert index["nchwc_block"] == NATIVE_BLOCK
    recorded = [(t["label"].split(" ")[0], t["blocked"], t["channels"]) for t in index["tensors"]]
    # ReorderInput of the 20-channel input, the 20→20 Conv (+Relu), the 4→12 Conv of z, the 20→12 Conv with the sum
    # fused in: held padded to 32 (or 24) channels by ORT
    assert recorded == [("ReorderInput", True, 20), ("relu1_nchwc", True, 20), ("conv3_nchwc", True, 12),
                        ("conv2_nchwc", True, 12), ("sum", False, 0)]
    assert index["shapes"] == [[1, 20, 8, 8], [1, 12, 8, 8]]
    with np.load(models["padded_inputs"]) as given:
        x, z = given["x"], given["z"]
    w = padded_weights()
    relu = np.maximum(conv(x, w["w1"], w["b1"], 1), 0)
    for sample in range(2):
        with np.load(run / "dump" / "raw" / f"{sample:06d}.npz") as raw:
            assert np.array_equal(raw["t0"], x[sample:sample + 1])  # the input itself, its padding left out
            assert np.array_equal(raw["t1"], relu[sample:sample + 1].astype(np.float32))
            assert np.array_equal(raw["t2"], conv(z[sample:sample + 1], w["w3"], w["b3"], 0).astype(np.float32))
            assert np.array_equal(raw["t3"], raw["t4"])  # the last Conv in NCHW is the model's output


def test_a_blocked_tensor_of_another_shape_is_refused_by_unblock():
    with pytest.raises(ValueError, match=r"a tensor of 32 NCHWc channels \(blocks of 16\) cannot hold 12 channels"):
        layout.unblock(np.zeros((1, 32, 2, 2), np.float32), 16, 12)
    with pytest.raises(ValueError, match=r"a tensor of shape \(1, 20, 2, 2\) is not held in NCHWc blocks of 16"):
        layout.unblock(np.zeros((1, 20, 2, 2), np.float32), 16, 20)


def _filters(run: Path, block: int, name: str, weights: dict[str, np.ndarray]) -> dict[str, str]:
    """Each reordered filter of the run's optimized graph read back in OIHW against the original; their formats."""
    optimized = onnx.load(run / "dump" / "optimized.onnx")
    stored = {i.name: numpy_helper.to_array(i) for i in optimized.graph.initializer}
    forms = layout.nchwc_filters(optimized)
    found = {}
    for node in optimized.graph.node:
        if node.domain == "com.microsoft.nchwc" and node.op_type == "Conv":
            original = weights[FILTERS[name][node.name]]
            o, i = original.shape[:2]
            read = layout.unblock_filter(stored[node.input[1]], block, forms[node.input[1]])
            assert np.array_equal(read[:o, :i], original), node.name
            assert not read[o:].any() and not read[:, i:].any()  # ORT's padding: zeros
            found[node.name] = forms[node.input[1]]
    return found


def test_the_filters_onnxruntime_reordered_read_back_in_oihw(models, tmp_path):
    aligned = _run(models["aligned"], models["aligned_inputs"], tmp_path, "aligned")
    assert _filters(aligned, NATIVE_BLOCK, "aligned", aligned_weights()) == {"relu1_nchwc": "OIHWBiBo", "y_nchwc": "OIHWBiBo"}
    padded = _run(models["padded"], models["padded_inputs"], tmp_path, "padded")
    # conv3 reads its 4-channel input in NCHW (fewer channels than a block): OIHWBo
    assert _filters(padded, NATIVE_BLOCK, "padded", padded_weights()) == {
        "relu1_nchwc": "OIHWBiBo", "conv3_nchwc": "OIHWBo", "conv2_nchwc": "OIHWBiBo"}


def test_a_dump_written_before_the_blocks_were_recorded_does_not_compare_them(models, tmp_path):
    old = Path(shutil.copytree(OLD_RUN, tmp_path / "runs" / "old"))
    new = _run(models["aligned"], models["aligned_inputs"], tmp_path / "runs", "new")
    out = CliRunner().invoke(app, ["diff", str(old), str(new)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert ("not compared: 4 tensor(s) held in NCHWc blocks of different or unrecorded sizes and not both recorded in "
            "NCHW (ReorderInput (com.microsoft.nchwc:ReorderInput, internal to ORT's optimized graph), pool_nchwc "
            "(com.microsoft.nchwc:MaxPool, internal to ORT's optimized graph), relu1_nchwc (com.microsoft.nchwc:Conv, "
            "internal to ORT's optimized graph), y_nchwc (com.microsoft.nchwc:Conv, internal to ORT's optimized graph)); "
            "the origin rule walks across them") in lines
    assert "tensors: 1 compared, all bit-identical in 2 samples" in lines
    # two old dumps read as before: every tensor compared as it was recorded
    again = Path(shutil.copytree(OLD_RUN, tmp_path / "runs" / "old-again"))
    out = CliRunner().invoke(app, ["diff", str(old), str(again), "--json"])
    tensors = json.loads(out.output)["tensors"]
    assert (tensors["compared"], tensors["blocked_apart"], tensors["nodes"]) == (5, [], [])


@pytest.mark.slow
def test_blocks_of_16_and_of_8_compare_by_value(models, tmp_path):
    """Native (AVX-512F: blocks of 16 here) against QEMU Haswell (FMA3: blocks of 8): the same values in other
    blocks. Before, the diff called ReorderInput and everything after it diverging."""
    runs = tmp_path / "runs"
    native = _run(models["aligned"], models["aligned_inputs"], runs, "native")
    haswell = _run(models["aligned"], models["aligned_inputs"], runs, "haswell", "--isa", "haswell")
    assert _index(haswell)["nchwc_block"] == 8
    out = CliRunner().invoke(app, ["diff", str(native), str(haswell), "--json"])
    result = json.loads(out.output)
    tensors = result["tensors"]
    assert (tensors["space"], tensors["compared"], tensors["nodes"], tensors["blocked_apart"]) == ("optimized", 5, [], [])
    assert out.exit_code == 0, out.output
    # ORT reordered the same filters into blocks of 8 there (other bytes): the same weights read back in OIHW
    assert _filters(haswell, 8, "aligned", aligned_weights()) == {"relu1_nchwc": "OIHWBiBo", "y_nchwc": "OIHWBiBo"}
    # so the diff's evidence calls them identical by value, as it calls every other constant
    graphs = [onnx.load(run / "dump" / "optimized.onnx") for run in (native, haswell)]
    stored = [{i.name: numpy_helper.to_array(i) for i in g.graph.initializer} for g in graphs]
    same = diff_tensors.constant_comparison(graphs[0], NATIVE_BLOCK, 8)
    for name in layout.nchwc_filters(graphs[0]):
        assert diff_tensors.same_value(stored[0][name], stored[1][name]) is (NATIVE_BLOCK == 8)  # the bytes: another order
        assert same(name, stored[0][name], stored[1][name])


@pytest.mark.slow
def test_open_nsfw_qdq_pinned_has_no_diverging_node_on_haswell(nsfw_run, tmp_path):
    """open_nsfw QDQ under session.x64quantprecision=1, the first photo: the final outputs are bit-identical natively
    and on QEMU Haswell; its NCHWc ReorderInput and MaxPool (pool1_nchwc) are the same values in blocks of 16 and
    of 8, and no node diverges (before: those two did)."""
    model = nsfw_run.path / "quantize" / "model.onnx"
    common = ["--pipeline", str(OPEN_NSFW), "--count", "1", "--session-config", "session.x64quantprecision=1"]
    native = _run(model, "package:photos", tmp_path, "native", *common, raw="none")
    haswell = _run(model, "package:photos", tmp_path, "haswell", *common, "--isa", "haswell", raw="none")
    out = CliRunner().invoke(app, ["diff", str(native), str(haswell), "--json"])
    tensors = json.loads(out.output)["tensors"]
    assert tensors["nodes"] == [] and tensors["blocked_apart"] == []
    blocked = [t for t in _index(haswell)["tensors"] if t["blocked"]]
    assert {t["label"].split(" ")[0] for t in blocked} >= {"pool1_nchwc"} and all(t["channels"] == 64 for t in blocked)
    assert out.exit_code == 0, out.output
