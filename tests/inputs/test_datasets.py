"""Image datasets as users keep them: class-folder trees and flat folders with a labels file, built from the
package photographs; their order, labels, errors, and what a run records of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from onnx_builders import build_classifier_model
from photo_files import class_tree, photo
from qconsist.cli import app
from qconsist.errors import ConfigError, InputError
from qconsist.inputs import Preprocess, open_input_set
from qconsist.inputs.labels import read_labels
from qconsist.inputs.record import read_samples
from qconsist.store.rundir import open_run

SMALL = Preprocess(resize=(8, 8))


def test_class_folder_tree_sorted_classes_and_paths(tmp_path):
    root = class_tree(tmp_path / "tree", {"dog": 2, "cat": 3, "bird": 1})
    photo(root / "cat" / "indoors" / "000.jpg", 9)  # a subfolder of a class belongs to the class
    inputs = open_input_set(root, SMALL, "x")
    assert list(inputs.names) == ["bird/000.jpg", "cat/000.jpg", "cat/001.jpg", "cat/002.jpg", "cat/indoors/000.jpg",
                                  "dog/000.jpg", "dog/001.jpg"]
    assert inputs.labels.classes == ("bird", "cat", "dog") and inputs.labels.source == "folders"
    assert inputs.labels.of(inputs.names) == [0, 1, 1, 1, 1, 2, 2]
    assert [inputs.subset(5).label(i) for i in range(2)] == [2, 2]
    expected = np.asarray(Image.open(root / "cat" / "001.jpg").convert("RGB").resize((8, 8), Image.Resampling.BILINEAR),
                          np.float32).transpose(2, 0, 1)
    np.testing.assert_array_equal(inputs.sample(2)["x"][0], expected)
    assert inputs.describe()["labels"] == {"source": "folders", "labelled": 7, "classes": 3}


def test_classes_file_orders_the_classes(tmp_path):
    root = class_tree(tmp_path / "tree", {"dog": 1, "cat": 1})
    (root / "classes.txt").write_text("# ImageNet order\ndog\ncat\nzebra\n")
    inputs = open_input_set(root, SMALL, "x")
    assert list(inputs.names) == ["cat/000.jpg", "dog/000.jpg"]  # the samples stay sorted by path
    assert inputs.labels.of(inputs.names) == [1, 0] and inputs.labels.classes == ("dog", "cat", "zebra")
    (root / "classes.txt").write_text("dog\n")
    with pytest.raises(ConfigError, match=r"classes.txt does not list class folder 'cat' \(1 folder\(s\) unlisted\)"):
        open_input_set(root, SMALL, "x")
    (root / "classes.txt").write_text("dog\ncat\ndog\n")
    with pytest.raises(ConfigError, match=r"classes.txt:3: class 'dog' is listed twice \(first on line 1\)"):
        open_input_set(root, SMALL, "x")


def test_class_tree_errors(tmp_path):
    root = class_tree(tmp_path / "tree", {"a": 1, "b": 1})
    (root / "empty").mkdir()
    with pytest.raises(InputError, match=r"class folder .*empty holds no images .* \(an empty class would shift the numbering\)"):
        open_input_set(root, SMALL, "x")
    (root / "empty").rmdir()
    photo(root / "stray.jpg", 3)
    with pytest.raises(InputError, match=r"holds images both at its top and in subfolder a; keep one layout"):
        open_input_set(root, SMALL, "x")
    (root / "stray.jpg").unlink()
    (tmp_path / "l.csv").write_text("a/000.jpg,1\n")
    with pytest.raises(ConfigError, match=r"has one folder per class, which labels its images"):
        open_input_set(root, SMALL, "x", labels=tmp_path / "l.csv")


@pytest.mark.parametrize("name, text", [
    ("labels.csv", "file,label\n000.jpg,2\n001.jpg,0\n002 copy.jpg,1\n"),
    ("labels.json", '{"000.jpg": 2, "001.jpg": 0, "002 copy.jpg": 1}'),
    ("labels.txt", "# file label\n000.jpg 2\n\n001.jpg 0\n002 copy.jpg 1\n"),
])
def test_flat_folder_with_a_labels_file(tmp_path, name, text):
    folder = tmp_path / "flat"
    for n, file in enumerate(["000.jpg", "001.jpg", "002 copy.jpg", "003.jpg"]):
        photo(folder / file, n)
    (folder / name).write_text(text)
    inputs = open_input_set(folder, SMALL, "x")
    assert list(inputs.names) == ["000.jpg", "001.jpg", "002 copy.jpg", "003.jpg"]
    assert inputs.labels.of(inputs.names) == [2, 0, 1, None]  # 003.jpg has no label
    assert inputs.describe()["labels"] == {"source": str(folder / name), "labelled": 3, "classes": 3}


def test_class_names_in_a_labels_file(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text("a.jpg,tabby\nb.jpg,goldfish\nc.jpg,tabby\n")
    labels = read_labels(path)
    assert labels.classes == ("goldfish", "tabby") and dict(labels.by_name) == {"a.jpg": 1, "b.jpg": 0, "c.jpg": 1}
    assert dict(read_labels(path, ("tabby", "goldfish")).by_name) == {"a.jpg": 0, "b.jpg": 1, "c.jpg": 0}
    with pytest.raises(ConfigError, match=r"labels.csv:2: class 'goldfish' is not in classes.txt"):
        read_labels(path, ("tabby",))


@pytest.mark.parametrize("name, text, message", [
    ("l.csv", "a.jpg,1,extra\n", r"l.csv:1: a row must be `file,label`, got 3 cell\(s\)"),
    ("l.txt", "a.jpg\n", r"l.txt:1: a line must be `file label`, got 'a.jpg'"),
    ("l.json", "[1, 2]", r"must map sample names to classes \(a JSON object\)"),
    ("l.json", "{bad", r"is not a JSON object of sample name -> class"),
    ("l.json", '{"a.jpg": -1}', r"sample 'a.jpg': class index -1 is negative"),
    ("l.json", '{"a.jpg": 1.5}', r"sample 'a.jpg': label 1.5 is neither a class index nor a class name"),
    ("l.csv", "a.jpg,1\nb.jpg,cat\n", r"mixes class indices and class names"),
    ("l.csv", "a.jpg,1\na.jpg,2\n", r"l.csv:2: sample 'a.jpg' is labelled twice, 1 and 2"),
])
def test_labels_file_errors(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_labels(tmp_path / name)


def test_two_labels_files_refused_and_labels_on_arrays_refused(tmp_path):
    folder = tmp_path / "flat"
    photo(folder / "a.jpg", 0)
    (folder / "labels.csv").write_text("a.jpg,0\n")
    (folder / "labels.json").write_text('{"a.jpg": 0}')
    with pytest.raises(ConfigError, match=r"holds labels.csv and labels.json: keep one labels file"):
        open_input_set(folder, SMALL, "x")
    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.float32))
    with pytest.raises(ConfigError, match=r"holds arrays; labels are read for images"):
        open_input_set(tmp_path / "a.npy", labels=folder / "labels.csv")


def test_run_records_files_digests_and_labels_in_a_sample_table(tmp_path):
    """A class-folder set through `qconsist run`: the manifest keeps a summary, the table every file's digest and
    label, and the set's digest is the same from the table's sample digests."""
    import xxhash

    model = build_classifier_model(tmp_path / "m.onnx", batch="n")
    root = class_tree(tmp_path / "tree", {"b": 2, "a": 3})
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "{root}"\n')
    result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(root), "--pipeline", str(pipeline),
                                      "--batch-size", "2", "--run-id", "tree", "--workers", "2"])
    assert result.exit_code == 0, result.output
    manifest = open_run(Path("runs/tree"))
    recorded = manifest.inputs
    assert "names" not in recorded and recorded["samples"] == "inputs/samples.jsonl" and recorded["offset"] == 0
    assert recorded["labels"] == {"source": "folders", "labelled": 5, "classes": 2}
    table = read_samples(Path("runs/tree"), manifest, recorded)
    assert table.names == ["a/000.jpg", "a/001.jpg", "a/002.jpg", "b/000.jpg", "b/001.jpg"]
    assert table.labels == [0, 0, 0, 1, 1] and table.classes == ["a", "b"]
    assert table.files == [xxhash.xxh3_128((root / n).read_bytes()).hexdigest() for n in table.names]
    whole = xxhash.xxh3_128(b"".join(bytes.fromhex(d) for d in table.digests)).hexdigest()
    assert recorded["digest"] == f"xxh3-128:{whole}"
    assert "inputs/samples.jsonl" in manifest.files
    (Path("runs/tree") / "inputs/samples.jsonl").write_text("tampered\n")
    from qconsist.errors import RunStoreError

    with pytest.raises(RunStoreError, match=r"inputs/samples.jsonl was modified after the run"):
        read_samples(Path("runs/tree"), manifest, recorded)


def test_gate_takes_the_labels_of_a_class_folder_evaluation_set(tmp_path):
    """The labels of the dataset and a nightly's labels file are one idea: a pipeline whose evaluation set is a
    class-folder tree is judged for accuracy without any labels file."""
    from qconsist.gate.evidence import load_side
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    model = build_classifier_model(tmp_path / "m.onnx")
    root = class_tree(tmp_path / "tree", {"x": 2, "y": 2})
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[model]\nonnx = "{model}"\n[preprocess]\nresize = [8, 8]\n[calibration]\ndata = "{root}"\n'
                        f'[evaluation]\ndata = "{root}"\n')
    result = run_pipeline(load_pipeline(pipeline), tmp_path / "runs")
    side = load_side(result.path)
    assert side.labels == {"x/000.jpg": 0, "x/001.jpg": 0, "y/000.jpg": 1, "y/001.jpg": 1}
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["inputs"]["evaluation"]["labels"]["labelled"] == 4
