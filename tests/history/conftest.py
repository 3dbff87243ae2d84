"""Histories of schema versions 1 and 2 (tests/data/history_v1.sql, history_v2.sql: each written by an older qconsist
from two real nights)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

V1_DUMP = Path(__file__).resolve().parents[1] / "data" / "history_v1.sql"
V2_DUMP = Path(__file__).resolve().parents[1] / "data" / "history_v2.sql"


@pytest.fixture
def v1_history(tmp_path) -> Path:
    """The version-1 history as a database file, exactly as the older qconsist left it."""
    path = tmp_path / "h.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_DUMP.read_text())
    return path


@pytest.fixture
def v2_history(tmp_path) -> Path:
    """The version-2 history as a database file, exactly as the qconsist before the entries' seconds left it."""
    path = tmp_path / "h.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(V2_DUMP.read_text())
    return path
