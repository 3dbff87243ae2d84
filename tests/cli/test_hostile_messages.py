"""Messages that said the wrong thing, and bad input that ended in exit 4 (issue 29, items 9 and 13): each is one
line with its documented exit code, and says what is really wrong."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The classifier, its arrays, two dumped inference runs of it, their diff as JSON, and a pipeline file."""
    folder = tmp_path_factory.mktemp("messages")
    model = build_classifier_model(folder / "classifier.onnx")
    arrays = save_arrays(folder / "arrays.npy", 4, seed=2)
    runs = folder / "runs"
    for run_id, threads in (("a", "0"), ("b", "1")):
        done = runner.invoke(app, ["run", str(model), "--inputs", str(arrays), "--dump", "--threads", threads,
                                   "--runs-dir", str(runs), "--run-id", run_id])
        assert done.exit_code == 0, done.output
    diff = runner.invoke(app, ["diff", str(runs / "a"), str(runs / "b"), "--json"])
    assert diff.exit_code in (0, 1), diff.output
    pipeline = folder / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "{arrays}"\n')
    return {"folder": folder, "model": model, "arrays": arrays, "runs": runs, "diff": json.loads(diff.stdout),
            "pipeline": pipeline}


def _one_line(result, code=2):
    assert (result.exit_code, result.stdout) == (code, ""), (result.exit_code, result.output)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    return result.stderr[len("error: "):-1]


# -- report FILE.json with a malformed diff result: 11 ways that were AttributeError / TypeError (exit 4) --------
VARIANTS = [("artifacts", "x"), ("artifacts", [1]), ("artifacts", True), ("tensors", 5), ("tensors", True),
            ("tensors", "x"), ("tensors.nodes", [1]), ("tensors.nodes", "x"), ("tensors.nodes", 5), ("outputs", "x"),
            ("outputs", [1])]


@pytest.mark.parametrize("key,value", VARIANTS, ids=[f"{k}={json.dumps(v)}" for k, v in VARIANTS])
def test_report_of_a_malformed_diff_result(made, tmp_path, key, value):
    data = copy.deepcopy(made["diff"])
    target = data
    for part in key.split(".")[:-1]:
        target = target.setdefault(part, {}) if isinstance(target.get(part), dict) or target.get(part) is None else target[part]
    target[key.split(".")[-1]] = value
    path = tmp_path / "diff.json"
    path.write_text(json.dumps(data))
    line = _one_line(runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "r.html")]))
    assert line.startswith(f"{path} is not a valid diff result: "), line
    assert not (tmp_path / "r.html").exists()


def test_report_of_the_diff_result_itself(made, tmp_path):
    path = tmp_path / "diff.json"
    path.write_text(json.dumps(made["diff"]))
    result = runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "<html" in (tmp_path / "r.html").read_text()


# -- names and sizes ---------------------------------------------------------------------------------------------
def test_a_300_character_name_is_told_its_length(made, tmp_path):
    pipeline = tmp_path / "long.toml"
    pipeline.write_text(f'name = "{"b" * 300}"\n' + made["pipeline"].read_text())
    line = _one_line(runner.invoke(app, ["pipeline", "run", str(pipeline), "--runs-dir", str(tmp_path / "runs")]))
    assert line == (f"{pipeline}: name '{'b' * 60}… (300 characters)' is 300 characters long; a name has at most 178 "
                    "(it labels the run directories: <runs_dir>/<name>-<time>-<random>)")


def test_a_10_mb_name_is_not_echoed_whole(made, tmp_path):
    pipeline = tmp_path / "huge.toml"
    pipeline.write_text(f'name = "../{"x" * 10_000_000}"\n' + made["pipeline"].read_text())
    line = _one_line(runner.invoke(app, ["pipeline", "run", str(pipeline), "--runs-dir", str(tmp_path / "runs")]))
    assert len(line) < 400 and "(10000003 characters)" in line


def test_a_300_character_run_id_is_told_its_length(made, tmp_path):
    line = _one_line(runner.invoke(app, ["run", str(made["model"]), "--inputs", str(made["arrays"]), "--runs-dir",
                                         str(tmp_path / "runs"), "--run-id", "r" * 300]))
    assert line == (f"invalid run id '{'r' * 120}… (300 characters)': it is 300 characters long; a run id has at most 201 "
                    "(a label such as a pipeline's name at most 178, the rest is its time and a random suffix)")


def test_a_path_component_over_255_bytes(made, tmp_path):
    long = tmp_path / ("c" * 300)
    line = _one_line(runner.invoke(app, ["runs", "list", "--runs-dir", str(long)]))
    assert line.endswith(f": '{'c' * 40}… (300 characters)' is 300 bytes long; a file name has at most 255"), line
    assert line.startswith("cannot use the path ")
    line = _one_line(runner.invoke(app, ["pipeline", "run", str(long) + ".toml"]))
    assert line.endswith("is 305 bytes long; a file name has at most 255"), line


def test_a_pipeline_read_from_dev_zero(made):
    line = _one_line(runner.invoke(app, ["pipeline", "run", "/dev/zero"]))
    assert line == "pipeline file /dev/zero: it holds more than 67108864 bytes (the limit for a file read whole)"


@pytest.mark.parametrize("command", ["pipeline", "policy"])
def test_nested_arrays_in_a_pipeline_or_policy(made, tmp_path, command):
    path = tmp_path / "deep.toml"
    path.write_text(made["pipeline"].read_text() + "deep = " + "[" * 100_000 + "]" * 100_000 + "\n")
    args = (["pipeline", "run", str(path)] if command == "pipeline"
            else ["gate", str(made["runs"] / "a"), "--policy", str(path)])
    assert _one_line(runner.invoke(app, args)) == f"{path}: invalid TOML (lists and tables nested more than 100 levels deep)"


# -- messages that misled ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("given,suggested", [("sqnr>>40", "sqnr>=40"), ("sqnr>=>40", "sqnr>=40"), ("top1>>0.9", "top1>=0.9"),
                                             ("max-abs>=>0.1", "max-abs<=0.1"), ("sqnr[prob]>>45", "sqnr[prob]>=45")])
def test_a_doubled_operator_gets_a_sane_suggestion(given, suggested):
    from qconsist.errors import ConfigError
    from qconsist.sensitivity.target import Target

    with pytest.raises(ConfigError, match=r"takes an? (lower|upper) bound: write (\S+)$") as caught:
        Target.parse(given)
    assert caught.value.message.rsplit("write ", 1)[1] == suggested
    assert Target.parse(suggested).text == suggested


def test_an_unknown_key_in_a_nightly_set_table_is_blamed_on_the_nightly(made, tmp_path):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(made["pipeline"].read_text())
    nightly = tmp_path / "nightly.toml"
    nightly.write_text('runs_dir = "runs"\n[[models]]\nname = "tiny"\npipeline = "p.toml"\n[models.set.calibration]\nbogus = 3\n')
    line = _one_line(runner.invoke(app, ["nightly", str(nightly)]))
    assert line.startswith(f"{nightly}: model 'tiny': its 'set' table: unknown key 'calibration.bogus' (known in [calibration]: ")
    pipeline.write_text(made["pipeline"].read_text() + "[quantize]\nbogus = 1\n")  # the pipeline file's own mistake: its own
    line = _one_line(runner.invoke(app, ["nightly", str(nightly)]))
    assert line.startswith(f"{pipeline}: unknown key "), line


def test_inspect_shows_a_tampered_run_as_modified(made, tmp_path):
    import shutil

    run = tmp_path / "a"
    shutil.copytree(made["runs"] / "a", run)
    (run / "outputs" / "o0.npy").open("r+b").write(b"\x93NUMPY")  # same bytes at the start: its size unchanged
    data = bytearray((run / "outputs" / "o0.npy").read_bytes())
    data[-1] ^= 1
    (run / "outputs" / "o0.npy").write_bytes(bytes(data))
    result = runner.invoke(app, ["inspect", str(run)])
    assert result.exit_code == 0, result.output
    first, second = result.stdout.splitlines()[:2]
    assert first.startswith(f"run {run}: inference, modified, ")
    assert second.startswith(f"  modified: run {run}: outputs/o0.npy was modified after the run (sha256 ")
    shown = json.loads(runner.invoke(app, ["inspect", str(run), "--json"]).stdout)
    assert shown["status"] == "modified" and len(shown["problems"]) == 1


def test_verify_refuses_an_absolute_output_file_as_diff_does(made, tmp_path):
    import shutil

    run = tmp_path / "a"
    shutil.copytree(made["runs"] / "a", run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["sections"]["inference"]["output_files"] = [str(made["folder"] / "elsewhere.npy")]
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["verify", str(run)])
    said = (f"run {run}: the manifest's outputs path '{made['folder'] / 'elsewhere.npy'}' is absolute; paths in a run "
            "directory are relative to it")
    assert (result.exit_code, result.stderr) == (2, f"error: {said}\n"), result.output
    assert f"  refused    {made['folder'] / 'elsewhere.npy'}  {said}" in result.stdout.splitlines()
    assert _one_line(runner.invoke(app, ["diff", str(run), str(made["runs"] / "b")])) == said


@pytest.mark.parametrize("suffix,kind", [(".gif", "GIF"), (".tiff", "TIFF")])
def test_an_animation_or_pages_are_refused_not_cut_to_one_frame(made, tmp_path, suffix, kind):
    frames = [Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)) for i in range(3)]
    path = tmp_path / f"moving{suffix}"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    line = _one_line(runner.invoke(app, ["run", str(made["model"]), "--inputs", str(path), "--pipeline", str(made["pipeline"]),
                                         "--runs-dir", str(tmp_path / "runs")]))
    assert line == (f"image {path} holds 3 frames ({kind} animation or pages); a sample is one picture: save the frame you "
                    "mean as its own file")
    frames[0].save(tmp_path / f"still{suffix}")
    assert runner.invoke(app, ["run", str(made["model"]), "--inputs", str(tmp_path / f"still{suffix}"), "--pipeline",
                               str(made["pipeline"]), "--runs-dir", str(tmp_path / "runs")]).exit_code == 0
