"""``InputOptions`` (typed, validated on creation, back to flags) and ``open_inputs``, the one way from them to
an input set: the Python API takes the CLI's rules (slice, check against the model, ``up_to`` for locate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qconsist.errors import ConfigError, InputError
from qconsist.inference.model import resolve_model
from qconsist.inputs.options import InputOptions
from qconsist.pipeline.inputs import open_inputs


@pytest.mark.parametrize(("given", "message"), [
    ({"offset": -1}, r"^offset must be >= 0, got -1$"),
    ({"count": 0}, r"^count must be >= 1, got 0$"),
    ({"count": True}, r"^count must be >= 1, got True$"),
    ({"workers": -2}, r"^workers must be >= 0, got -2$"),
    ({"source": " "}, r"^inputs must name an input set, got ' '$"),
])
def test_invalid_options_are_refused_on_creation(given, message):
    with pytest.raises(ConfigError, match=message):
        InputOptions(**given)


def test_to_args_gives_every_set_option_back_with_absolute_paths(tmp_path):
    options = InputOptions("data.npy", pipeline=Path("p.toml"), offset=3, count=4, workers=0, labels=Path("l.csv"))
    assert options.to_args() == ["--inputs", "data.npy", "--offset", "3", "--count", "4",
                                 "--pipeline", str(tmp_path / "cwd" / "p.toml"), "--workers", "0",
                                 "--labels", str(tmp_path / "cwd" / "l.csv")]
    assert InputOptions().to_args() == ["--inputs", "package:photos", "--offset", "0"]
    assert InputOptions(None, offset=2).to_args() == ["--offset", "2"]


def test_open_inputs_slices_and_checks_against_the_model(small_models):
    source = resolve_model(small_models["classifier"])
    whole = np.load(small_models["arrays"])
    opened = open_inputs(InputOptions(str(small_models["arrays"]), offset=2, count=3), source)
    samples = [step for _, step in opened.batches(1)]
    assert len(samples) == 3
    np.testing.assert_array_equal(samples[0]["x"][0], whole[2])
    np.testing.assert_array_equal(samples[2]["x"][0], whole[4])


def test_count_beyond_the_set_is_an_error_unless_up_to(small_models):
    source = resolve_model(small_models["classifier"])
    options = InputOptions(str(small_models["arrays"]), offset=10, count=8)
    with pytest.raises(InputError, match=r"has 12 samples; asked for 10\.\.17$"):
        open_inputs(options, source)
    assert len(open_inputs(options, source, up_to=True)) == 2  # locate: up to 8 samples, the 2 that are there


def test_no_input_set_named_is_an_error(small_models):
    with pytest.raises(ConfigError, match=r"^inputs names no input set"):
        open_inputs(InputOptions(None), resolve_model(small_models["classifier"]))
