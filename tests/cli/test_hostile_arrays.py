"""``.npz`` input sets are checked as a run directory's ``.npz`` files are (``store.confine.check_npz``, one
helper): before anything but the members' headers is decompressed, a truncated archive, a member that is not an
array, a header claiming 768 GiB, a deflate bomb and a text file named ``.npz`` are one line and exit 2
(issue 29, items 5 and 13)."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

from hostile_files import npz_archives
from onnx_builders import build_classifier_model
from qconsist.cli import app
from qconsist.errors import InputError


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    folder = tmp_path_factory.mktemp("npz")
    return {"model": build_classifier_model(folder / "classifier.onnx"), **npz_archives(folder / "sets")}


CASES = {
    "truncated": "input set {path} is not a valid .npz archive (File is not a zip file)",
    "member": "input set {path}: member 'notes.txt' is not an array (.npy); refused",
    "claims": ("input set {path} member input.npy: its header says (1073741824, 3, 8, 8) float32 (824633720960 bytes "
               "with the header), the file holds 640; refused"),
    "bomb": ("input set {path} member input.npy: its header says (4, 3, 8, 8) float32 (3200 bytes with the header), "
             "the file holds 910164096; refused"),
    "text": "input set {path} is not a valid .npz archive (File is not a zip file)",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_npz_input_set_is_one_line(archives, case, tmp_path):
    path = archives[case]
    result = CliRunner().invoke(app, ["run", str(archives["model"]), "--inputs", str(path), "--runs-dir", str(tmp_path / "runs")])
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr == f"error: {CASES[case].format(path=path)}\n"
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_the_good_archive_runs(archives, tmp_path):
    result = CliRunner().invoke(app, ["run", str(archives["model"]), "--inputs", str(archives["good"]), "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output


def test_the_bomb_is_refused_before_it_is_inflated(archives, monkeypatch):
    """Only the member's header is read: the archive's 868 MiB are never decompressed."""
    from qconsist.inputs import open_input_set

    read = []
    real = zipfile.ZipExtFile.read

    def counting(self, n=-1):
        data = real(self, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting)
    with pytest.raises(InputError, match=r"its header says \(4, 3, 8, 8\) float32 \(3200 bytes with the header\), the file "
                                         r"holds 910164096; refused"):
        open_input_set(archives["bomb"])
    assert 0 < sum(read) < 1 << 16


def test_members_over_the_memory_budget_are_refused_unread(archives):
    from qconsist.store.confine import check_npz

    with pytest.raises(InputError, match=r"^input set x: its members decompress to 3200 bytes, more than the 1000 this reader "
                                         r"holds in memory \(a \d+-byte archive\); refused$"):
        check_npz(archives["good"], "input set x", InputError, budget=1000)
    assert check_npz(archives["good"], "input set x", InputError, budget=3200) == {"input": ("<f4", (4, 3, 8, 8))}
    assert np.load(archives["good"])["input"].shape == (4, 3, 8, 8)
