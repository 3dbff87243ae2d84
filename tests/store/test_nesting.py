"""Deeply nested JSON in a run directory (a manifest, ``dump/index.json``, a marker) or a file given to a command
is one line and exit 2 — never a RecursionError — and one such run does not break ``runs list`` (issue 29,
item 6)."""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.store.serde import loads

runner = CliRunner()
DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 50_000 + "1" + "}" * 50_000


def _one_line(result, code=2):
    assert result.exit_code == code, (result.exit_code, result.stderr, result.stdout)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    return result.stderr


@pytest.mark.parametrize("text", [DEEP, DEEP_OBJECT, "[" * 101 + "]" * 101])
def test_loads_bounds_the_nesting(text):
    with pytest.raises(ValueError, match=r"^lists and tables nested more than 100 levels deep$"):
        loads(text)
    assert loads("[" * 100 + "]" * 100) == json.loads("[" * 100 + "]" * 100)


def test_a_deep_manifest_is_one_line_everywhere(runs_copy):
    runs = runs_copy["runs"]
    (runs_copy["pipeline"] / "manifest.json").write_text(DEEP)
    for command in (["verify", str(runs_copy["pipeline"])], ["diff", str(runs_copy["pipeline"]), str(runs_copy["pipeline2"])],
                    ["inspect", str(runs_copy["pipeline"])], ["report", str(runs_copy["pipeline"]), "-o", "r.html"],
                    ["gate", str(runs_copy["pipeline"])]):
        line = _one_line(runner.invoke(app, command))
        assert "nested more than 100 levels deep" in line or "is incomplete" in line, (command, line)
    result = runner.invoke(app, ["runs", "list", "--runs-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.stderr
    statuses = {r["name"]: r["status"] for r in json.loads(result.stdout)["runs"]}
    assert statuses["pipeline"] == "invalid" and statuses["pipeline2"] == "complete" and statuses["inference"] == "complete"


def test_a_deep_dump_index_with_its_tracks_covered(runs_copy):
    run = runs_copy["inference"]
    index = run / "dump" / "index.json"
    index.write_text(DEEP_OBJECT)
    manifest = json.loads((run / "manifest.json").read_text())
    blob = index.read_bytes()
    manifest["files"]["dump/index.json"] = {"sha256": hashlib.sha256(blob).hexdigest(), "md5": hashlib.md5(blob).hexdigest(),
                                            "size": len(blob)}
    (run / "manifest.json").write_text(json.dumps(manifest))
    for command in (["diff", str(run), str(runs_copy["inference2"])], ["diff", str(runs_copy["inference2"]), str(run)]):
        line = _one_line(runner.invoke(app, command))
        assert "dump/index.json" in line and "nested more than 100 levels deep" in line, (command, line)


def test_a_deep_marker_and_a_deep_report_file(runs_copy, tmp_path):
    runs = runs_copy["runs"]
    (runs / "stuck").mkdir()
    (runs / "stuck" / "RUNNING.json").write_text(DEEP)
    result = runner.invoke(app, ["runs", "list", "--runs-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.stderr
    assert {r["name"]: r["status"] for r in json.loads(result.stdout)["runs"]}["stuck"] == "invalid"
    diff = tmp_path / "diff.json"
    diff.write_text(DEEP)
    line = _one_line(runner.invoke(app, ["report", str(diff), "-o", str(tmp_path / "r.html")]))
    assert line == f"error: {diff} is not a diff or sensitivity JSON file (lists and tables nested more than 100 levels deep)\n"
