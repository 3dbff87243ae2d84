"""Small complete runs built in code (seconds): two pipeline runs of the classifier and two dumped inference
runs of its quantized model, copied into each test's folder by ``runs_copy``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from onnx_builders import build_classifier_model, save_arrays

LEGACY = Path(__file__).resolve().parents[1] / "data" / "old_runs"


@pytest.fixture(scope="session")
def small_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``pipeline``, ``pipeline2`` (the same pipeline again), ``inference``, ``inference2`` (its quantized
    model on 3 samples, dumped with every raw tensor, twice) in one runs folder; ``data`` the arrays."""
    from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    folder = tmp_path_factory.mktemp("small-runs")
    model = build_classifier_model(folder / "classifier.onnx")
    data = save_arrays(folder / "arrays.npy", 6, seed=2)
    pipeline = folder / "tiny.toml"
    pipeline.write_text(f'name = "tiny"\n[model]\nonnx = "{model}"\n[calibration]\ndata = "{data}"\ncount = 4\n'
                        f'[evaluation]\ndata = "{data}"\noffset = 4\ncount = 2\n')
    runs = folder / "runs"
    out = {"data": data, "runs": runs}
    for key in ("pipeline", "pipeline2"):
        out[key] = run_pipeline(load_pipeline(pipeline), runs_dir=runs, run_id=key).path
    source = resolve_model(out["pipeline"])
    inputs = open_input_set(data, None, input_specs(source.path)[0].name).subset(0, 3)
    request = RunRequest(ExecutionOptions(), dump=True, raw=RawSelection.parse("all"))
    for key in ("inference", "inference2"):
        out[key] = run_inference(source, inputs, request, runs, run_id=key).run_dir
    return out


@pytest.fixture()
def runs_copy(small_runs, tmp_path) -> dict[str, Path]:
    """A private copy of the small runs (same names, one runs folder) and of two runs written in the per-sample
    layout (``legacy``, ``legacy2``: tests/data/old_runs), free to damage; ``outside``: a folder beside it with a
    bait file (``secret.onnx``, a copy of the quantized model) that nothing may open."""
    runs = tmp_path / "runs"
    shutil.copytree(small_runs["runs"], runs, symlinks=True)
    for key, name in (("legacy", "v1570-a"), ("legacy2", "v1570-b")):  # runs of the per-sample layout
        shutil.copytree(LEGACY / name, runs / key, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(runs / "pipeline" / "quantize" / "model.onnx", outside / "secret.onnx")
    (outside / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    return {**{k: runs / k for k in ("pipeline", "pipeline2", "inference", "inference2", "legacy", "legacy2")}, "runs": runs,
            "outside": outside, "data": small_runs["data"]}
