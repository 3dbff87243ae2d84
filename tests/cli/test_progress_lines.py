"""Progress where no one watches live (CI, a pipe): a plain line on stderr at least every 10 s of work, saying what
runs, how far it got and the time left, known from the first item done; on a terminal the bars' time left is
known from the first item too."""

from __future__ import annotations

import importlib
import io
import re
import threading
import time

import pytest
from rich.console import Console
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.progress import INTERVAL, ProgressLines, clock_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_says_what_how_far_and_the_time_left_from_the_first_item():
    clock, lines = FakeClock(), []
    progress = ProgressLines(lines.append, clock, interval=3600)  # no line from the thread in this test
    assert INTERVAL == 10.0
    with progress.task("nightly", 5) as night:
        assert progress.line() == "progress 0:00:00: nightly 0/5 (0%), ETA unknown"
        clock.now += 32
        night.advance()  # the first entry: 32 s
        with progress.task("stage quantize", None):
            clock.now += 12
            with progress.task("calibrating", 100) as calibrating:
                clock.now += 8
                calibrating.advance(40)
                assert progress.line() == ("progress 0:00:52: nightly 1/5 (20%), ETA 0:03:28; stage quantize 0:00:20; "
                                           "calibrating 40/100 (40%), ETA 0:00:12")
        assert progress.line() == "progress 0:00:52: nightly 1/5 (20%), ETA 0:03:28"
    assert progress.line() is None and lines == []
    assert clock_text(3725.4) == "1:02:05"


def test_a_slow_step_still_gets_its_lines():
    """One step of a task that takes longer than the interval, without any advance: lines all the same."""
    lines: list[str] = []
    progress = ProgressLines(lines.append, interval=0.1)
    with progress.task("one long step", 1) as handle:
        time.sleep(0.55)
        handle.advance()
    count = len(lines)
    time.sleep(0.25)
    assert len(lines) == count  # none after the work
    assert 3 <= count <= 6, lines
    assert all(re.fullmatch(r"progress 0:00:0\d: one long step 0/1 \(0%\), ETA unknown", line) for line in lines), lines
    assert not [t for t in threading.enumerate() if t.name == "qconsist-progress"]


def test_the_interval_counts_across_short_tasks():
    """Stages of less than the interval each, one after the other: a line every interval all the same."""
    lines: list[str] = []
    progress = ProgressLines(lines.append, interval=0.2)
    for stage in range(8):
        with progress.task(f"stage {stage}", None):
            time.sleep(0.07)
    assert len(lines) >= 2, lines


def test_bars_know_the_time_left_from_the_first_item(monkeypatch):
    cli_app = importlib.import_module("qconsist.cli.app")
    stream = io.StringIO()
    monkeypatch.setattr(cli_app, "stderr_console", lambda: Console(file=stream, force_terminal=True, width=120))
    progress = cli_app.RichProgress()
    with progress.task("nightly", 5) as handle:
        time.sleep(0.3)
        handle.advance()
        progress._progress.refresh()
        shown = stream.getvalue().splitlines()[-1]
    assert re.search(r" 1/5 +0:00:00 0:00:0[1-3]$", shown), shown  # not -:--:-- until the third entry


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    folder = tmp_path_factory.mktemp("progress-lines")
    build_classifier_model(folder / "cls.onnx")
    save_arrays(folder / "arrays.npy", 12, seed=2)
    (folder / "cls.toml").write_text('name = "cls"\n[model]\nonnx = "cls.onnx"\n[calibration]\ndata = "arrays.npy"\n'
                                     'count = 8\n[evaluation]\ndata = "arrays.npy"\noffset = 8\n')
    return folder


@pytest.mark.parametrize("command", ["pipeline run", "run", "sensitivity"])
def test_piped_commands_print_progress_lines(classifier, monkeypatch, command):
    """With the interval shortened to 20 ms, each command's piped stderr shows its work as it goes."""
    monkeypatch.setattr("qconsist.progress.INTERVAL", 0.02)
    runs = classifier / "runs"
    if not (runs / "base").is_dir():
        assert CliRunner().invoke(app, ["-q", "pipeline", "run", str(classifier / "cls.toml"), "--runs-dir", str(runs),
                                        "--run-id", "base"]).exit_code == 0
    args = {
        "pipeline run": ["pipeline", "run", str(classifier / "cls.toml"), "--runs-dir", str(runs)],
        "run": ["run", str(runs / "base"), "--inputs", str(classifier / "arrays.npy"), "--dump", "--runs-dir", str(runs)],
        "sensitivity": ["sensitivity", str(runs / "base"), "--runs-dir", str(runs)],
    }[command]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("progress ")]
    assert lines, result.stderr
    assert all(re.fullmatch(r"progress \d:\d\d:\d\d: .+", line) for line in lines)
    expected = {"pipeline run": r"stage (convert|optimize|quantize)", "run": r"inference.* \d+/12 \(\d+%\), ETA ",
                "sensitivity": r"(probing nodes|searching|quant-error|calibrating)"}[command]
    assert any(re.search(expected, line) for line in lines), lines
    assert not any(line.startswith("progress ") for line in result.stdout.splitlines())
    quiet = CliRunner().invoke(app, ["-q", *args])
    assert "progress " not in quiet.stderr
