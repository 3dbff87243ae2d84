"""A history of schema version 1 (tests/data/history_v1.sql: written by an older qconsist from two real nights)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

V1_DUMP = Path(__file__).resolve().parents[1] / "data" / "history_v1.sql"


@pytest.fixture
def v1_history(tmp_path) -> Path:
    """The version-1 history as a database file, exactly as the older qconsist left it."""
    path = tmp_path / "h.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_DUMP.read_text())
    return path
