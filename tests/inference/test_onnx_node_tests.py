"""ONNX's own backend node tests through ``qconsist run --dump`` (issue 27 item 10, issue 29 item 10), made at
set-up by onnx's generator and fed exactly their own inputs (a folder holding one ``.npz``): every case
onnxruntime runs gives qconsist's recorded outputs equal to onnxruntime's, the dump faithful, or a one-line
refusal (exit 2); never an internal error. The default tier runs a sample (every 40th case and the cases the
audit found crashing); the ``slow`` tier runs every case (``tests/onnx_node_tests.py`` says how each is judged)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from onnx_node_tests import collect, counts, run_case
from qconsist.cli import app

# found crashing by the audit: sequence outputs under --dump, models that do not compute per sample at batch 3
AUDITED = {"test_if_seq", "test_sequence_insert_at_back", "test_gather_0", "test_gemm_all_attributes", "test_scan_sum",
           "test_scatternd", "test_split_equal_parts_1d_opset13", "test_affine_grid_2d", "test_qlinearconv",
           "test_dequantizelinear", "test_quantizelinear", "test_isinf", "test_shape", "test_identity_sequence",
           "test_castlike_DOUBLE_to_FLOAT", "test_isnan"}
EVERY = 40


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    return collect(tmp_path_factory.mktemp("onnx-node-tests"), lambda name, index: name in AUDITED or index % EVERY == 0)


def test_sampled_node_tests_equal_onnxruntime_or_are_refused_in_one_line(sampled, tmp_path):
    outcomes = {o.name: o for o in (run_case(case, tmp_path / "runs") for case in sampled)}
    assert [o for o in outcomes.values() if o.kind == "failed"] == []
    # test_shape: ORT folds the Shape of a fixed input into a constant output (it was 'y' is not in list, exit 4)
    for name in ("test_gather_0", "test_gemm_all_attributes", "test_scan_sum", "test_scatternd", "test_shape",
                 "test_split_equal_parts_1d_opset13", "test_affine_grid_2d", "test_qlinearconv", "test_castlike_DOUBLE_to_FLOAT",
                 "test_isnan", "test_isinf"):
        assert outcomes[name].kind == "equal", outcomes[name]
    assert outcomes["test_if_seq"].kind == "refused"
    assert outcomes["test_if_seq"].detail.endswith("test_if_seq/model.onnx: output 'res' is seq(tensor(float)), not "
                                                   "a tensor; qconsist records tensors")
    assert outcomes["test_sequence_insert_at_back"].detail == (
        "error: model input 'sequence' has type seq(tensor(int64)), which qconsist cannot feed")
    assert outcomes["test_identity_sequence"].detail == (  # it was KeyError: 0, exit 4
        "error: model input 'x' has type seq(tensor(float)), which qconsist cannot feed")
    # of the cases onnxruntime runs, qconsist refuses only outputs that are no tensors (or tensors of float8, int4,
    # bfloat16, string: onnxruntime 1.32.0 runs Cast to float8) and a model without inputs
    refused = {o.name: o.detail for o in outcomes.values() if o.kind == "refused"}
    assert all(re.search(r"is (seq|optional)\(.*\), not a tensor; qconsist records tensors$|has no inputs$|an element type qconsist does not record", d)
               for d in refused.values()), refused
    summary = counts(list(outcomes.values()))
    assert summary["equal"] == summary["ort_can_run"] - len(refused) and summary["equal"] >= 40, json.dumps(summary, indent=1)


@pytest.mark.parametrize("name", ["test_gather_0", "test_gemm_all_attributes", "test_scatternd",
                                  "test_split_equal_parts_1d_opset13", "test_affine_grid_2d"])
def test_models_that_do_not_compute_per_sample_refuse_a_batch_of_3_in_one_line(sampled, tmp_path, name):
    case = next(c for c in sampled if c.name == name)
    result = CliRunner().invoke(app, ["run", str(case / "model.onnx"), "--inputs", str(case / "feeds"), "--dump",
                                      "--batch-size", "3", "--dynamic-batch", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"error: {case / 'model.onnx'} ")
    assert "(--dynamic-batch)" in result.stderr


@pytest.mark.slow
def test_every_node_test(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx-node-tests-all")
    outcomes = [run_case(case, folder / "runs") for case in collect(folder / "cases")]
    summary = counts(outcomes)
    (folder / "counts.json").write_text(json.dumps(summary, indent=1))
    assert [o for o in outcomes if o.kind == "failed"] == [], json.dumps(summary, indent=1)
    refused = [o.detail for o in outcomes if o.kind == "refused"]
    assert all(re.search(r"is (seq|optional)\(.*\), not a tensor; qconsist records tensors$|has no inputs$|an element type qconsist does not record", d)
               for d in refused), refused
