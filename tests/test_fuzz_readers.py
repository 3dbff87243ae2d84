"""Fuzzing the readers of user files: any bad manifest, pipeline, policy or nightly file is one clear
``QconsistError`` (one line), never a traceback. Hypothesis, seeded through its database-free settings."""

from __future__ import annotations

import json
import string
import tomllib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qconsist.errors import QconsistError
from qconsist.gate.policy import Policy, load_policy, parse_policy
from qconsist.nightly.config import parse_nightly
from qconsist.pipeline.config import load_pipeline, parse_pipeline
from qconsist.store.manifest import Manifest

ROOT = Path(__file__).resolve().parent.parent
PIPELINE_TEXT = (ROOT / "pipelines" / "open_nsfw.toml").read_text()
POLICY_TEXT = (ROOT / "policies" / "default.toml").read_text()
NIGHTLY_TEXT = (ROOT / "pipelines" / "nightly.toml").read_text()

FUZZ = settings(max_examples=300, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["package:photos", "MinMax", "QDQ", "int8", "BGR", "md5", "quantize", "off"]),
)
json_values = st.recursive(
    scalars, lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=20,
)


def _keyed(keys: list[str]) -> st.SearchStrategy:
    """Tables whose keys are mostly the reader's own, with values of every type (and some nesting)."""
    key = st.one_of(st.sampled_from(keys), st.text(string.ascii_lowercase + "_.", min_size=1, max_size=8))
    return st.recursive(
        st.dictionaries(key, scalars, max_size=6),
        lambda inner: st.dictionaries(key, st.one_of(scalars, inner, st.lists(scalars, max_size=3)), max_size=6),
        max_leaves=25,
    )


def _one_clear_error(call) -> None:
    try:
        call()
    except QconsistError as exc:
        assert exc.message and "\n" not in exc.message.strip() and "Traceback" not in exc.message


def _mutations(text: str) -> st.SearchStrategy:
    """The real file with a slice replaced by random text, deleted, or duplicated."""
    return st.tuples(st.integers(0, len(text)), st.integers(0, 40), st.text(max_size=30)).map(
        lambda t: text[: t[0]] + t[2] + text[t[0] + t[1]:]
    )


# -- manifest ------------------------------------------------------------------------------------------------
MANIFEST_KEYS = ["schema", "kind", "run_id", "status", "stages", "sections", "model", "inputs", "calibration",
                 "environment", "command", "started", "finished", "name", "artifact"]


@FUZZ
@given(st.one_of(json_values, _keyed(MANIFEST_KEYS), _keyed(MANIFEST_KEYS).map(
    lambda d: {**d, "schema": "qconsist.run/1", "kind": "pipeline", "run_id": "r", "status": "complete"})))
def test_manifest_from_json(data):
    _one_clear_error(lambda: Manifest.from_json(data))


@FUZZ
@given(st.one_of(st.binary(max_size=200), _mutations(json.dumps({
    "schema": "qconsist.run/1", "kind": "pipeline", "run_id": "r", "status": "complete",
    "stages": [{"name": "convert", "artifact": {"md5": "0"}}], "sections": {}}, indent=1)).map(str.encode)))
def test_manifest_load(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("m") / "manifest.json"
    path.write_bytes(blob)
    _one_clear_error(lambda: Manifest.load(path))


# -- pipeline (helper B's reader) ----------------------------------------------------------------------------
PIPELINE_KEYS = ["name", "runs_dir", "model", "source", "onnx", "prototxt", "caffemodel", "convert", "opset",
                 "dynamic_batch", "optimize", "method", "atol", "rtol", "preprocess", "resize", "crop", "mean",
                 "channel_order", "calibration", "data", "offset", "count", "repeat", "quantize", "format",
                 "per_channel", "evaluation", "percentile", "provider", "activation_type"]


@FUZZ
@given(st.one_of(_keyed(PIPELINE_KEYS), _mutations(PIPELINE_TEXT).map(
    lambda text: (lambda: tomllib.loads(text))).map(lambda f: _try(f))))
def test_pipeline_from_data(data):
    if data is None:
        return
    _one_clear_error(lambda: parse_pipeline(data, ROOT / "pipelines" / "fuzz.toml"))


@FUZZ
@given(st.one_of(st.binary(max_size=200), _mutations(PIPELINE_TEXT).map(str.encode)))
def test_pipeline_file(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("p") / "pipeline.toml"
    path.write_bytes(blob)
    _one_clear_error(lambda: load_pipeline(path))


def _try(function):
    try:
        return function()
    except tomllib.TOMLDecodeError:
        return None


# -- policy --------------------------------------------------------------------------------------------------
POLICY_KEYS = ["schema", "artifacts", "hash", "expect_changed", "calibration", "repeat_must_agree", "waive_nonfinite",
               "inference", "repeat_must_be_identical", "allow_nonfinite_outputs", "drift", "float", "baseline",
               "max_abs_diff", "min_top1_agreement", "labels", "min_accuracy", "gpu", "require_pinned"]


@FUZZ
@given(_keyed(POLICY_KEYS))
def test_policy_from_data(data):
    _one_clear_error(lambda: Policy.from_json(data))


@FUZZ
@given(st.one_of(st.text(max_size=200), _mutations(POLICY_TEXT)))
def test_policy_text(text):
    _one_clear_error(lambda: parse_policy(text))


@FUZZ
@given(st.binary(max_size=100))
def test_policy_file(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("pol") / "policy.toml"
    path.write_bytes(blob)
    _one_clear_error(lambda: load_policy(path))


# -- nightly -------------------------------------------------------------------------------------------------
NIGHTLY_KEYS = ["runs_dir", "history", "policy", "models", "name", "pipeline", "set", "gpu_config", "labels", "locate"]


@FUZZ
@given(st.one_of(_keyed(NIGHTLY_KEYS), _mutations(NIGHTLY_TEXT).map(lambda text: _try(lambda: tomllib.loads(text)))))
def test_nightly_from_data(data):
    if data is None:
        return
    _one_clear_error(lambda: parse_nightly(data, ROOT / "pipelines" / "fuzz.toml"))


def test_fuzzers_reach_valid_files():
    """The mutation fuzzers start from real, valid files (so mutations probe the readers' deep paths)."""
    assert load_pipeline(ROOT / "pipelines" / "open_nsfw.toml").name == "open_nsfw"
    assert parse_policy(POLICY_TEXT).to_json()["drift"]["float"] == {"max_abs_diff": None, "min_top1_agreement": 0.9,
                                                                      "min_sqnr_db": 15.0}
    assert len(parse_nightly(tomllib.loads(NIGHTLY_TEXT), ROOT / "pipelines" / "nightly.toml").models) == 5


# -- issue 29: nesting, .npz archives, diff results given to `report` -----------------------------------------
@FUZZ
@given(st.one_of(st.integers(1, 400), st.sampled_from([5000, 100_000])), st.sampled_from(["[", '{"a":']), st.sampled_from(["json", "toml"]))
def test_any_nesting_is_read_or_one_clear_error(tmp_path_factory, depth, opener, kind):
    """JSON and TOML nested 1 to 400, 5,000 or 100,000 deep: read up to 100 levels, one clear error beyond, never RecursionError."""
    closer = "]" if opener == "[" else "}"
    if kind == "json":
        path = tmp_path_factory.mktemp("n") / "manifest.json"
        path.write_text(opener * depth + "1" + closer * depth)
        _one_clear_error(lambda: Manifest.load(path))
    else:
        path = tmp_path_factory.mktemp("n") / "pipeline.toml"
        value = "[" * depth + "1" + "]" * depth if opener == "[" else "{a = " * depth + "1" + "}" * depth
        path.write_text(PIPELINE_TEXT + f"\ndeep = {value}\n")
        _one_clear_error(lambda: load_pipeline(path))


def _npz_blob() -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, input=np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8), other=np.ones((2, 4), np.int64))
    return buffer.getvalue()


NPZ = _npz_blob()


@FUZZ
@given(st.one_of(
    st.tuples(st.integers(0, len(NPZ)), st.integers(0, 255)).map(lambda t: NPZ[: t[0]] + bytes([t[1]]) + NPZ[t[0] + 1:]),
    st.integers(0, len(NPZ)).map(lambda n: NPZ[:n]),
    st.binary(max_size=300),
))
def test_an_npz_input_set_is_read_or_one_clear_error(tmp_path_factory, blob):
    """A .npz input set with a byte flipped, cut short, or random: opened (and every sample made), or one line."""
    from qconsist.inputs import open_input_set

    path = tmp_path_factory.mktemp("z") / "set.npz"
    path.write_bytes(blob)

    def read():
        inputs = open_input_set(path)
        for _ in inputs:
            pass

    _one_clear_error(read)


DIFF_KEYS = ["artifacts", "calibration", "tensors", "outputs", "options", "environment", "versions", "capture", "notes",
             "engines", "tolerance", "output_stats", "same_run", "accuracy", "run_a", "run_b"]


@FUZZ
@given(st.dictionaries(st.sampled_from(DIFF_KEYS), json_values, min_size=1, max_size=4))
def test_report_of_a_diff_result_with_fields_of_any_type(tmp_path_factory, fields):
    """A diff result whose fields hold any JSON value: a page, or one line naming the file (never exit 4)."""
    from qconsist.report import render_paths

    data = {"schema": "qconsist.diff/1", "run_a": "a", "run_b": "b", "artifacts": {}, "calibration": {}, "tensors": None,
            "outputs": None, **fields}
    path = tmp_path_factory.mktemp("d") / "diff.json"
    path.write_text(json.dumps(data, allow_nan=True))
    _one_clear_error(lambda: render_paths([path]))
