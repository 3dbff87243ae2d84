"""Nightly files and the package: resolver: valid files load, every mistake is one clear error."""

from pathlib import Path

import pytest

from qconsist.errors import ConfigError, InputError
from qconsist.nightly import load_nightly, resolve_package_path
from qconsist.pipeline.config import ModelKind
from qconsist.stages.quantize import CalibrationMethodChoice

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_nightly_file():
    config = load_nightly(ROOT / "pipelines" / "nightly.toml")
    assert [m.name for m in config.models] == ["open_nsfw-minmax", "open_nsfw-percentile", "nudenet-320n", "fcn_head",
                                              "fcn_head-determinized"]
    assert "determinize" in config.models[4].pipeline.stages and "determinize" not in config.models[3].pipeline.stages
    methods = [m.pipeline.calibration.options.method for m in config.models[:2]]
    assert methods == [CalibrationMethodChoice.MINMAX, CalibrationMethodChoice.PERCENTILE]
    nudenet = config.models[2]
    assert nudenet.pipeline.model.kind is ModelKind.BUNDLED
    assert nudenet.pipeline.model.source == "nudenet_320n"
    assert nudenet.policy == ROOT / "policies" / "detector.toml"
    assert config.models[0].policy == ROOT / "policies" / "default.toml"
    assert config.runs_dir == ROOT / "runs" and config.history == ROOT / "runs" / "history.sqlite"


def test_package_resolver_finds_a_shipped_file():
    import skimage

    path = resolve_package_path("package:skimage/data/astronaut.png")
    assert path == Path(skimage.__file__).parent / "data" / "astronaut.png" and path.is_file()


@pytest.mark.parametrize("text, error, message", [
    ("package:skimage/nope.onnx", InputError, r"package 'skimage' has no file nope.onnx"),
    ("package:no_such_pkg_x/m.onnx", InputError, r"package 'no_such_pkg_x' is not installed"),
    ("package:skimage", ConfigError, r"is not a package path|write package:<module>/<file"),
    ("package:skimage/../x.onnx", ConfigError, r"the file must lie inside the package"),
    ("skimage/data/astronaut.png", ConfigError, r"is not a package path"),
])
def test_package_resolver_errors(text, error, message):
    with pytest.raises(error, match=message):
        resolve_package_path(text)


def _write(tmp_path, text):
    path = tmp_path / "nightly.toml"
    path.write_text(text)
    return path


PIPE = f'pipeline = "{ROOT / "pipelines" / "open_nsfw.toml"}"\n'


@pytest.mark.parametrize("text, message", [
    ("", r"list at least one model as \[\[models\]\]"),
    ("runs = 'x'\n[[models]]\nname='a'\n" + PIPE, r"unknown key 'runs' \(known: history, models, policy, runs_dir\)"),
    ("[[models]]\nname='a b'\n" + PIPE, r"'name' must be letters, digits"),
    ("[[models]]\nname='a'\n", r"model 'a': needs pipeline = \"<file>\" or a \[models.pipeline\] table"),
    ("[[models]]\nname='a'\nlocat=true\n" + PIPE, r"unknown key 'locat'"),
    ("[[models]]\nname='a'\n" + PIPE + "[[models]]\nname='a'\n" + PIPE, r"model name 'a' is listed twice"),
    ("[[models]]\nname='a'\nlocate='yes'\n" + PIPE, r"'locate' must be true or false, got 'yes'"),
    ("[[models]]\nname='a'\ngpu_config='FAST'\n" + PIPE, r"unknown cudnn_conv_algo_search 'FAST'"),
    ("[[models]]\nname='a'\n" + PIPE + "[models.set.calibration]\nmethod='Best'\n", r"calibration.method must be one of"),
    ("[[models]]\nname='a'\npipeline='missing.toml'\n", r"pipeline file .*missing.toml does not exist"),
    ("[[models]]\nname='a'\nlabels='l.json'\n" + PIPE, r"labels file .*l.json does not exist"),
    ("[[models\n", r"invalid TOML"),
])
def test_bad_nightly_files(tmp_path, text, message):
    with pytest.raises((ConfigError, InputError), match=message):
        load_nightly(_write(tmp_path, text))


def test_missing_nightly_file(tmp_path):
    with pytest.raises(InputError, match=r"nightly file .*none.toml does not exist"):
        load_nightly(tmp_path / "none.toml")


def test_nightly_cli_refuses_unknown_model_and_bad_file(tmp_path):
    from typer.testing import CliRunner

    from qconsist.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["nightly", str(ROOT / "pipelines" / "nightly.toml"), "--only", "nope",
                                 "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert result.stderr == (f"error: {ROOT / 'pipelines' / 'nightly.toml'} lists no model 'nope'; "
                             "models: open_nsfw-minmax, open_nsfw-percentile, nudenet-320n, fcn_head, fcn_head-determinized\n")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    bad = tmp_path / "bad.toml"
    bad.write_text("[[models]]\nname = 'x'\n")
    result = runner.invoke(app, ["nightly", str(bad)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {bad}: model 'x': needs pipeline = \"<file>\" or a [models.pipeline] table\n"
    history = runner.invoke(app, ["history", "m", "--db", str(tmp_path / "none.sqlite")])
    assert history.exit_code == 2
    assert history.stderr == f"error: history database {tmp_path / 'none.sqlite'} does not exist; run qconsist nightly first (or give --history)\n"
