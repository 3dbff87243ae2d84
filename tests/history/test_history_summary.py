"""``summarize_history``: what it keeps, and every way of asking for what the history does not hold."""

from __future__ import annotations

import pytest

from qconsist.errors import ConfigError, InputError, RunStoreError
from qconsist.history import History, summarize_history
from qconsist.history.summary import HistorySummary, gpu_label


@pytest.fixture
def history(v1_history) -> History:
    """The two real nights of the version-1 fixture, migrated, and a third night on two GPU types."""
    db = History(v1_history)
    db.start_night("n3", "nightly.toml", {}, started="2026-02-01T02:00:00Z")
    for gpu, names in (("H100", ["NVIDIA H100 80GB HBM3"]), ("A10G", ["NVIDIA A10G", "NVIDIA A10G"])):
        db.start_entry("n3", f"convnet@{gpu}", started="2026-02-01T02:00:00Z")
        db.finish_entry("n3", f"convnet@{gpu}", None, None, None, "its worker was lost", gpu_type=gpu, gpus=names)
    db.finish_night("n3", {})
    return History(db.path, read_only=True)


def test_models_gpu_types_and_nights(history):
    summary = summarize_history(history)
    assert [s.key for s in summary.series] == ["convnet", "convnet-percentile", "convnet@A10G", "convnet@H100"]
    assert summary.models == ("convnet", "convnet-percentile")
    assert summary.gpu_types == ("A10G", "H100", "none (CPU)")
    assert not summary.passed and not summary  # the latest nights failed or could not run
    only = summarize_history(history, models=["convnet"], gpus=["H100"])
    assert [s.key for s in only.series] == ["convnet@H100"] and [n.night_id for n in only.nights] == ["n3"]
    last = summarize_history(history, nights=1)
    assert [s.key for s in last.series] == ["convnet@A10G", "convnet@H100"]
    key = summarize_history(history, models=["convnet@A10G"])
    assert [s.key for s in key.series] == ["convnet@A10G"] and key.series[0].latest.error == "its worker was lost"


def test_gpu_label():
    assert gpu_label("H100", ["NVIDIA A10G"]) == "H100"
    assert gpu_label(None, ["NVIDIA A10G", "NVIDIA A10G", "NVIDIA A100"]) == "NVIDIA A100, NVIDIA A10G"
    assert gpu_label(None, []) == "none (CPU)"


@pytest.mark.parametrize("ask, error, message", [
    (dict(models=["resnet"]), InputError, r"no nightly history for model 'resnet' in .*h.sqlite; models: convnet, convnet-percentile$"),
    (dict(gpus=["h100"]), InputError, r"no night ran on GPU type 'h100' in .*; GPU types: A10G, H100, none \(CPU\)$"),
    (dict(nights=0), ConfigError, r"nights must be a whole number >= 1, got 0$"),
    (dict(nights=True), ConfigError, r"nights must be a whole number >= 1, got True$"),
    (dict(models=["convnet-percentile"], nights=1), InputError,
     r"holds no night of the models and GPU types asked for in its last 1 night\(s\); give more nights$"),
])
def test_what_the_history_does_not_hold(history, ask, error, message):
    with pytest.raises(error, match=message):
        summarize_history(history, **ask)


def test_an_empty_history(tmp_path):
    empty = History(tmp_path / "empty.sqlite")
    with pytest.raises(InputError, match=r"history .*empty.sqlite holds no model's night yet; run qconsist nightly first$"):
        summarize_history(empty)
    empty.start_night("n1", "nightly.toml", {})  # a night that recorded no model yet
    with pytest.raises(InputError, match=r"holds no model's night yet"):
        summarize_history(empty)


def test_summary_json(history):
    summary = summarize_history(history)
    assert HistorySummary.from_json(summary.to_json()) == summary
    with pytest.raises(RunStoreError, match=r"not a history summary of schema 'qconsist.history-summary/1' \(found 'x'\)"):
        HistorySummary.from_json({"schema": "x"})
    with pytest.raises(RunStoreError, match=r"history summary is malformed: KeyError\('source'\)"):
        HistorySummary.from_json({"schema": "qconsist.history-summary/1"})
