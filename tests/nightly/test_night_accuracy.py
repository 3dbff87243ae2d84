"""One definition of accuracy through a night: the quantized inference run records it against the nightly's
labels, the gate's ``labels.accuracy`` is that figure, the history keeps it as ``accuracy.top1``, and the entry
keeps the labels in a file of its own instead of copying them into its manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from old_runs import old_inputs
from qconsist.cli import app
from qconsist.history import History
from qconsist.store.run import Run


def test_the_night_records_accuracy_once_and_everyone_reads_it(tmp_path):
    made = old_inputs(tmp_path / "work", flat=True)
    names = sorted(p.name for p in made["images"].iterdir())
    labels = {name: i % 5 for i, name in enumerate(names)}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    pipeline = tmp_path / "tiny.toml"
    pipeline.write_text(made["pipeline"].read_text().replace("[calibration]\n", "[calibration]\nrepeat = 2\n")
                        + f'[evaluation]\ndata = "{made["images"]}"\n')
    config = tmp_path / "nightly.toml"
    config.write_text(f'runs_dir = "runs"\n[[models]]\nname = "tiny"\npipeline = "{pipeline}"\nlabels = "labels.json"\n'
                      "locate = false\n")
    result = CliRunner().invoke(app, ["nightly", str(config), "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)["entries"][0]
    quantized = Run.open(next(r["path"] for r in entry["runs"] if r["role"] == "quantized"))
    recorded = quantized.inference.accuracy
    # independently: the top-1 of the stored outputs against the labels
    scores = np.load(quantized.path / "outputs" / "o0.npy").reshape(len(names), -1)
    right = int((scores.argmax(axis=1) == [labels[n] for n in names]).sum())
    assert (recorded.output, recorded.labelled, recorded.top1, recorded.top5) == ("prob", 8, right, None)
    check = next(c for c in entry["verdict"]["checks"] if c["name"] == "labels.accuracy")
    assert check["status"] == "pass" and check["measured"]["accuracy"] == recorded.top1_share == right / 8
    history = History(tmp_path / "runs" / "history.sqlite")
    figures = history.model_rows("tiny")[-1]["figures"]
    assert figures["accuracy.top1"] == figures["labels.accuracy"] == right / 8 and "accuracy.top5" not in figures
    entry_run = Path(entry["entry_run"])
    manifest = json.loads((entry_run / "manifest.json").read_text())
    assert manifest["sections"]["nightly_entry"]["labels"] == "labels.json" and "labels.json" in manifest["files"]
    assert json.loads((entry_run / "labels.json").read_text()) == labels
    gated = CliRunner().invoke(app, ["gate", str(entry_run), "--json"])  # the entry read back: its labels file
    assert gated.exit_code == 0, gated.output
    again = next(c for c in json.loads(gated.stdout)["checks"] if c["name"] == "labels.accuracy")
    assert again["measured"]["accuracy"] == right / 8
