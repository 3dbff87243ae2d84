"""What "identical in content" means for two nights run apart (another executor, another runs folder): the
same history rows (hashes, verdicts, runs by role), the same files in every run directory (models and
dumps byte for byte, JSON as data), and the same reports, once run ids, the runs folder, clocks and
timings are taken out."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from qconsist.history import History

_ID = re.compile(r"\d{8}T\d{6}-[0-9a-f]{6}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_TIMING_CELL = re.compile(r"<td>[0-9.e+-]+</td></tr>")  # the seconds column of report tables
_WALL = re.compile(r"Wall time of the night: [0-9.]+ s \((\w+) executor; the entries together: [0-9.]+ s\)")  # a night's page
_HANDOUT = re.compile(r'<p class="muted">handed out [^<]*</p>')  # the order the executor handed tasks out in, and why
TIMING_KEYS = {"ms_per_sample", "started", "finished", "updated", "recorded", "run_id", "pid"}  # and *seconds


def _text(text: str, root: Path) -> str:
    text = _ID.sub("ID", text.replace(str(root), "RUNS"))
    text = _HANDOUT.sub("HANDOUT", _WALL.sub("Wall time of the night: S", text))
    return _TIMING_CELL.sub("<td>S</td></tr>", _TIME.sub("TIME", text))


def _data(value, root: Path):
    if isinstance(value, dict):
        if "calibration" in value and "sha256" in value and "run_id" in value:  # an inference run's ``source_manifest``:
            value = {"calibration": value["calibration"]}  # the hashes of a manifest holding run ids and clocks
        return {k: _data(v, root) for k, v in value.items() if k not in TIMING_KEYS and not k.endswith("seconds")}
    if isinstance(value, list):
        return [_data(v, root) for v in value]
    return _text(value, root) if isinstance(value, str) else value


def run_content(run: Path, root: Path) -> dict[str, object]:
    """Every file of a run directory: JSON as data, text reports as text, anything else by sha256."""
    content: dict[str, object] = {}
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        name = str(path.relative_to(run))
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            if name == "manifest.json":  # its `files` hash reports that carry timings; each file is compared here
                data.pop("files", None)
            content[name] = _data(data, root)
        elif path.suffix in (".html", ".md", ".xml"):
            content[name] = _text(path.read_text(), root)
        else:
            content[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return content


def night_content(history: Path, night_id: str, root: Path) -> dict[str, object]:
    """One night of a history: per model its status, error, hashes, verdict and its runs' content by role."""
    db = History(history)
    content: dict[str, object] = {}
    for model in db.models():
        for row in db.model_rows(model):
            if row["night_id"] != night_id:
                continue
            content[model] = {
                "status": row["status"], "error": row["error"], "hashes": row["hashes"], "figures": row["figures"],
                "verdict": _data(row["verdict"], root),
                "runs": {role: run_content(Path(path), root) for role, path in sorted(row["runs"].items())},
            }
    return content
