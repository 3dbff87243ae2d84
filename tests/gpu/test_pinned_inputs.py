"""Production's inputs page-locked on the CUDA EP (``qconsist.inference.pinned``): a run with input workers registers
their ring with the CUDA runtime, records it, and computes the same bits as a run fed from private pageable arrays.
Run on the GPU machine: ``pytest -m gpu tests/gpu/test_pinned_inputs.py``."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from photo_files import photo
from qconsist.diff import diff_runs
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inference.session import input_specs
from qconsist.inputs import open_input_set
from qconsist.pipeline.config import load_pipeline

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
COUNT = 200  # 6 steps of 32 and one of 8


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_page_locked_inputs_give_the_same_bits_as_pageable_ones(nsfw_models, tmp_path, caplog):
    """open_nsfw QDQ re-stamped to a dynamic batch, batch 32, over 200 JPEGs: with 4 input workers the ring is
    page-locked (the manifest says so, with its size), without workers the steps are private pageable arrays
    (the manifest says why not); the outputs and the samples' records are the same bytes. HEURISTIC: the two runs
    are two sessions, and EXHAUSTIVE may time its way to other kernels in each (a difference that would not be
    page-locking's)."""
    folder = tmp_path / "jpegs"
    for n in range(COUNT):
        photo(folder / f"{n:04d}.jpg", n, (160 + n % 7, 120))
    model = nsfw_models["qdq"]
    config = load_pipeline(REPO / "pipelines" / "open_nsfw.toml")
    options = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "HEURISTIC"})
    request = RunRequest(options, batch_size=32, dynamic_batch=True)
    runs = {}
    for workers in (4, 0):
        inputs = open_input_set(folder, config.preprocess, input_specs(model)[0].name).with_workers(workers)
        with caplog.at_level(logging.INFO, logger="qconsist"):
            caplog.clear()
            result = run_inference(resolve_model(model), inputs, request, tmp_path / "runs", run_id=f"w{workers}")
        manifest = json.loads((result.run_dir / "manifest.json").read_text())
        said = [r.getMessage() for r in caplog.records if r.name == "qconsist.inference.pinned"]
        startup = [r.getMessage() for r in caplog.records if r.getMessage().startswith("start-up: ")]
        runs[workers] = (result, manifest["sections"]["inference"]["input_memory"], said, startup)
    (locked, memory, said, startup), (pageable, pageable_memory, pageable_said, _) = runs[4], runs[0]
    assert memory["page_locked"] is True and memory["note"] == "" and memory["bytes"] >= 32 * 3 * 224 * 224 * 4
    assert len(said) == 1 and said[0].startswith("inputs page-locked: the input workers' ring of ")
    assert len(startup) == 1 and "pin inputs " in startup[0].split("; beside: ")[1]
    assert pageable_memory["page_locked"] is False and pageable_memory["note"].startswith("the steps are made in this process")
    assert len(pageable_said) == 1 and pageable_said[0].startswith("inputs pageable: the steps are made in this process")
    for name in ("outputs/o0.npy", "inputs/samples.jsonl"):
        assert _md5(locked.run_dir / name) == _md5(pageable.run_dir / name), name
    assert locked.samples == pageable.samples == COUNT


def test_a_device_dump_with_input_workers_page_locks_them_and_records_what_a_pageable_dump_does(nsfw_models, tmp_path):
    """The two start-up parts that want CuPy on the CUDA EP — the page-locking of the input workers' ring and the
    device recorder's start — begin together once the inputs are opened: on an H200 they imported CuPy at once and
    the dump ended in an internal error (a partially initialized ``cupy``). A device dump with 4 input workers
    page-locks their ring and its records and outputs are those of the same dump fed without workers."""
    folder = tmp_path / "jpegs"
    for n in range(96):
        photo(folder / f"{n:04d}.jpg", n, (160 + n % 7, 120))
    model = nsfw_models["qdq"]
    config = load_pipeline(REPO / "pipelines" / "open_nsfw.toml")
    options = ExecutionOptions("cuda", {"cudnn_conv_algo_search": "HEURISTIC"})
    request = RunRequest(options, batch_size=32, dynamic_batch=True, dump=True, fingerprints="device")
    runs = {}
    for workers in (4, 0):
        inputs = open_input_set(folder, config.preprocess, input_specs(model)[0].name).with_workers(workers)
        runs[workers] = run_inference(resolve_model(model), inputs, request, tmp_path / "runs", run_id=f"d{workers}")
    memory = json.loads((runs[4].run_dir / "manifest.json").read_text())["sections"]["inference"]["input_memory"]
    assert memory["page_locked"] is True
    assert runs[4].dump.faithful and runs[0].dump.faithful and runs[4].dump.tensors == runs[0].dump.tensors
    for name in ("outputs/o0.npy", "inputs/samples.jsonl"):
        assert _md5(runs[4].run_dir / name) == _md5(runs[0].run_dir / name), name
    compared = diff_runs(runs[0].run_dir, runs[4].run_dir)
    assert compared.passed and compared.tensors.compared == runs[0].dump.tensors and compared.tensors.nodes == []
