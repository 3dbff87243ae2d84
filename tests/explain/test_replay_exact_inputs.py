"""A replay feeds a model input from the run's input set, opened again and checked against its digest. A folder of
``.npz`` files fed exactly as they are (rank-0 inputs: a sample rate) cannot be stacked into steps of several
samples; the digest pass took steps of up to 32 and refused such a set ("samples 0 and 1 of one step have shapes
[] and []"), so every replay of silero_vad's If said "cannot replay" (tests/test_corpus_replay.py)."""

from __future__ import annotations

import numpy as np

from batch_models import sample_rate_model, save_feeds
from qconsist.explain.replay import replay_inputs
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set
from qconsist.inputs.digest import set_digest
from qconsist.store.run import Run


def test_an_input_set_with_a_rank_0_input_is_opened_again_and_its_digest_checked(tmp_path):
    model = sample_rate_model(tmp_path / "sr.onnx")
    rng = np.random.default_rng(5)
    samples = [{"x": rng.normal(size=(1, 16)).astype(np.float32), "sr": np.array(rate, np.int64)}
               for rate in (8000, 16000, 22050)]
    feeds = save_feeds(tmp_path / "feeds", samples)
    run = run_inference(resolve_model(model), open_input_set(feeds, None, "x"),
                        RunRequest(ExecutionOptions(), dump=True), tmp_path / "runs", run_id="sr").run_dir
    opened, where = replay_inputs(Run.open(run), model)
    assert where == (0, 3)
    for i, sample in enumerate(samples):
        got = opened.sample(i)
        assert got["sr"].shape == () and got["sr"].dtype == np.int64 and int(got["sr"]) == int(sample["sr"])
        np.testing.assert_array_equal(got["x"], sample["x"])
    # the digest is the one the run recorded, computed one sample at a time
    fresh = open_input_set(feeds, None, "x")
    assert fresh.digest() == Run.open(run).manifest.inputs["digest"]
    assert fresh.digest() == set_digest(info.digest for step in fresh.steps(1) for info in step.infos)
