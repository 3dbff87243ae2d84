"""onnxruntime's session configuration entries as execution options: validated, recorded only when given, given
back as flags, and applied to every session qconsist makes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import ConfigError
from qconsist.inference.session import ExecutionOptions, create_session

from explain.qdq_models import qdq_conv_model, qdq_inputs


def test_entries_are_text_sorted_by_key_and_recorded_only_when_given():
    options = ExecutionOptions(session_config={"session.use_env_allocators": 1, "session.disable_quant_qdq": True})
    assert dict(options.session_config) == {"session.disable_quant_qdq": "1", "session.use_env_allocators": "1"}
    assert options.to_json()["session_config"] == {"session.disable_quant_qdq": "1", "session.use_env_allocators": "1"}
    assert options.to_args()[-4:] == ["--session-config", "session.disable_quant_qdq=1",
                                      "--session-config", "session.use_env_allocators=1"]
    assert ExecutionOptions.from_json(options.to_json()) == options and options != ExecutionOptions()
    assert "session_config" not in ExecutionOptions().to_json()  # runs recorded before the field read the same
    assert ExecutionOptions.from_json(ExecutionOptions().to_json()) == ExecutionOptions()


@pytest.mark.parametrize("entries, message", [
    ({"disable_quant_qdq": "1"}, r"^session_config key 'disable_quant_qdq' is not an onnxruntime configuration key "
                                 r"such as session\.disable_quant_qdq$"),
    ({"session.disable_quant_qdq": [1]}, r"^session_config session\.disable_quant_qdq: the value must be text or a "
                                         r"number, got \[1\]$"),
    (["session.disable_quant_qdq"], r"^session_config must be a table of KEY = VALUE entries, got \['session\.disable_quant_qdq'\]$"),
])
def test_bad_entries_are_refused(entries, message):
    with pytest.raises(ConfigError, match=message):
        ExecutionOptions(session_config=entries)


def test_the_flag_refuses_what_is_not_key_value(tmp_path):
    result = CliRunner().invoke(app, ["run", str(tmp_path / "m.onnx"), "--inputs", "x.npy", "--session-config", "nope"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --session-config 'nope': write KEY=VALUE, e.g. session.disable_quant_qdq=1")


def test_an_entry_reaches_onnxruntime(tmp_path: Path):
    """Measured on the QDQ conv built here: session.disable_quant_qdq=1 keeps onnxruntime from fusing the QDQ group
    into QLinearConv at level all: 3 elements of 3 samples round one step apart. A key onnxruntime does not have
    changes nothing (onnxruntime ignores it: qconsist records it as given)."""
    model = qdq_conv_model(tmp_path / "qdq.onnx")
    samples = np.load(qdq_inputs(tmp_path / "x.npy"))

    def outputs(entries: dict[str, str]) -> list[np.ndarray]:
        session = create_session(model, ExecutionOptions(session_config=entries))
        return [session.run(None, {"x": x[None]})[0] for x in samples]

    plain = outputs({})
    assert sum(int((p != u).sum()) for p, u in zip(plain, outputs({"session.disable_quant_qdq": "1"}))) == 3
    assert sum(int((p != u).sum()) for p, u in zip(plain, outputs({"session.no_such_key": "1"}))) == 0
