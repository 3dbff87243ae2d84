"""The Python API page (docs/python-api.md) runs as written: its ```python blocks, in order, in one namespace, in a
folder laid out as a checkout (the bundled open_nsfw pipeline file), on the real open_nsfw model."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "python-api.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.S | re.M)


def test_the_page_has_examples():
    blocks = _blocks()
    assert len(blocks) >= 5
    assert all("assert" in block for block in blocks)  # each example checks what it shows


@pytest.mark.slow
def test_the_python_api_examples_run(tmp_path, monkeypatch):
    (tmp_path / "pipelines").mkdir()
    shutil.copyfile(ROOT / "pipelines" / "open_nsfw.toml", tmp_path / "pipelines" / "open_nsfw.toml")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "python_api_page"}
    for number, block in enumerate(_blocks(), 1):
        exec(compile(block, f"{PAGE.name} block {number}", "exec"), namespace)  # noqa: S102 - the page's own examples
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith("nsfw-")) == ["nsfw-again", "nsfw-all", "nsfw-disable"]
