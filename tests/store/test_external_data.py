"""An artifact is its whole content (issue 29, item 3): a model whose weights lie in an external data file, changed
between two runs, is not "artifacts: identical" in ``diff``; ``run --dump`` of it works."""

from __future__ import annotations

import onnx
import pytest
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app

runner = CliRunner()


@pytest.fixture()
def external(tmp_path):
    plain = build_classifier_model(tmp_path / "plain.onnx")
    model = tmp_path / "model" / "model.onnx"
    model.parent.mkdir()
    onnx.save(onnx.load(str(plain)), str(model), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.data", size_threshold=0)
    return {"model": model, "data": model.parent / "model.data", "arrays": save_arrays(tmp_path / "arrays.npy", 4, seed=2),
            "runs": tmp_path / "runs"}


def _run(external, run_id, *extra):
    result = runner.invoke(app, ["run", str(external["model"]), "--inputs", str(external["arrays"]), "--runs-dir",
                                 str(external["runs"]), "--run-id", run_id, *extra])
    assert result.exit_code == 0, result.output
    return result


def test_weights_changed_in_external_data_are_not_identical_artifacts(external):
    _run(external, "a")
    blob = bytearray(external["data"].read_bytes())
    blob[10] ^= 0x40  # one weight of conv_w, the .onnx file untouched
    external["data"].write_bytes(bytes(blob))
    _run(external, "b")
    result = runner.invoke(app, ["diff", str(external["runs"] / "a"), str(external["runs"] / "b")])
    assert result.exit_code in (0, 1), result.output
    lines = result.stdout.splitlines()
    assert "artifacts: identical" not in lines
    assert lines[2:4] == ["artifacts: first differing stage: model",
                          "  model: the same .onnx bytes with another recorded content hash: the weights in its external data "
                          "files changed between the runs (the files as they are now cannot show which)"]


def test_run_dump_of_a_model_with_external_data(external):
    result = _run(external, "dumped", "--dump")
    assert "dump faithful: final outputs bit-identical to production in 4 samples" in result.stdout + result.stderr
    assert (external["runs"] / "dumped" / "dump" / "optimized.onnx").is_file()
    assert not (external["runs"] / "dumped" / "dump" / "model.data").exists()
