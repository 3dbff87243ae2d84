"""The nightly history: an embedded SQLite database of nights, runs, artifact hashes, verdicts and environments.

Safe when two nightlies overlap: the database runs in WAL mode (readers never block the writer), every
connection waits up to ``BUSY_TIMEOUT_MS`` for a lock, and every write is one ``BEGIN IMMEDIATE``
transaction, so a night killed mid-way leaves every committed row intact and its own night ``running``
until :meth:`History.mark_abandoned` (called by the next nightly) marks it ``incomplete``.

Schema (``PRAGMA user_version = 4``; a file of an older version is migrated in place by the first writer that
opens it, in one transaction, and read as it is by a reader)::

    environments(sha TEXT PRIMARY KEY, data TEXT)                -- fingerprint JSON, stored once
    nights(night_id TEXT PRIMARY KEY, config TEXT, started TEXT, finished TEXT,
           status TEXT,                                          -- running | complete | incomplete
           pid INTEGER, host TEXT, environment_sha TEXT, summary TEXT)
    entries(night_id TEXT, model TEXT, status TEXT,              -- running | done | error
            error TEXT, entry_run TEXT, started TEXT, finished TEXT,
            gpu_type TEXT, gpus TEXT,                            -- v2: the GPU type asked for, the GPUs it ran on
            seconds REAL,                                        -- v3: the task's own wall seconds, measured where
                                                                 --     it ran (NULL: not measured)
            handed_out TEXT,                                     -- v4: when the head process handed the task out
            PRIMARY KEY (night_id, model))
    runs(night_id TEXT, model TEXT, role TEXT, run_id TEXT, kind TEXT, path TEXT, recorded TEXT,
         PRIMARY KEY (night_id, model, role))                    -- pipeline, inference, repeat, float, locate
    hashes(night_id TEXT, model TEXT, stage TEXT, md5 TEXT, sha256 TEXT, content TEXT,
           PRIMARY KEY (night_id, model, stage))
    verdicts(night_id TEXT, model TEXT, passed INTEGER, baseline_night TEXT, changed_stages TEXT,
             first_diverging_node TEXT, reasons TEXT, verdict TEXT, recorded TEXT,
             origin_nodes TEXT,                                  -- v2
             PRIMARY KEY (night_id, model))
    figures(night_id TEXT, model TEXT, name TEXT, value REAL,   -- v2: qconsist.history.figures
            PRIMARY KEY (night_id, model, name))

A model's key is its nightly name, or ``name@TYPE`` for each GPU type of an entry with ``gpus``. Version 1 kept
no GPU of an entry, no origin nodes and no figures apart from the verdict's JSON: the migration to version 2 fills
``origin_nodes`` and ``figures`` from that JSON, and a reader of a version-1 file derives them from it the same
way (``qconsist.history.figures.verdict_figures``); an entry's GPUs are then those of its night's environment.

Version 3 adds ``entries.seconds``: the entry task's own wall time, from its start to its outcome, measured inside
the task (in this process or in its Ray worker). The next night hands its tasks out longest first by each key's last
``seconds`` (``last_seconds``). The migration adds the column (NULL on every older row: unknown); a reader of an
older file reads ``seconds`` as ``None``.

Version 4 makes an entry's ``started`` and ``finished`` its own: while the entry runs (``running``) ``started`` is
when the head process handed the task out; once its outcome is recorded, where the outcome carries the task's own
start (``EntryOutcome.started``, measured where it ran: for Ray, in its worker, not at submission), ``started`` is
that start and ``finished`` that start plus ``seconds`` (both UTC to the millisecond), so ``finished - started`` is
the entry's duration and entries that ran at once overlap in time as they did. The hand-out time is kept in the new
``handed_out`` (a Ray task's wait for a free slot is ``started - handed_out``). An entry whose outcome carries no
start (it never ran: no node could run it, its worker was lost every time) and an entry of an interrupted night keep
the head's times: ``started`` the hand-out, ``finished`` when the outcome (or the interruption) was recorded. Rows of
an older file are kept as they are and ``handed_out`` is NULL on them: their ``started`` is the hand-out time and
their ``finished`` the recording time (in the file's order), as those versions wrote them; a reader of an older
file reads ``handed_out`` as ``None``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import socket
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from qconsist.errors import ConfigError, OutputError, RunStoreError
from qconsist.history.figures import check_figures, verdict_figures
from qconsist.store.liveness import process_alive
from qconsist.store.rundir import utc_now
from qconsist.store.serde import loads

log = logging.getLogger(__name__)

SCHEMA_VERSION = 4
BUSY_TIMEOUT_MS = 60_000

# version 1: what a new database starts from; the migrations below take it to SCHEMA_VERSION
_DDL_V1 = """
CREATE TABLE IF NOT EXISTS environments(sha TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nights(
    night_id TEXT PRIMARY KEY, config TEXT NOT NULL, started TEXT NOT NULL, finished TEXT,
    status TEXT NOT NULL, pid INTEGER, host TEXT, environment_sha TEXT REFERENCES environments(sha), summary TEXT);
CREATE TABLE IF NOT EXISTS entries(
    night_id TEXT NOT NULL REFERENCES nights(night_id), model TEXT NOT NULL, status TEXT NOT NULL,
    error TEXT, entry_run TEXT, started TEXT NOT NULL, finished TEXT, PRIMARY KEY (night_id, model));
CREATE TABLE IF NOT EXISTS runs(
    night_id TEXT NOT NULL, model TEXT NOT NULL, role TEXT NOT NULL, run_id TEXT NOT NULL, kind TEXT NOT NULL,
    path TEXT NOT NULL, recorded TEXT NOT NULL, PRIMARY KEY (night_id, model, role));
CREATE TABLE IF NOT EXISTS hashes(
    night_id TEXT NOT NULL, model TEXT NOT NULL, stage TEXT NOT NULL, md5 TEXT, sha256 TEXT, content TEXT,
    PRIMARY KEY (night_id, model, stage));
CREATE TABLE IF NOT EXISTS verdicts(
    night_id TEXT NOT NULL, model TEXT NOT NULL, passed INTEGER NOT NULL, baseline_night TEXT,
    changed_stages TEXT NOT NULL, first_diverging_node TEXT, reasons TEXT NOT NULL, verdict TEXT NOT NULL,
    recorded TEXT NOT NULL, PRIMARY KEY (night_id, model));
CREATE INDEX IF NOT EXISTS entries_model ON entries(model, started);
"""
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        "ALTER TABLE entries ADD COLUMN gpu_type TEXT",
        "ALTER TABLE entries ADD COLUMN gpus TEXT",
        "ALTER TABLE verdicts ADD COLUMN origin_nodes TEXT",
        "CREATE TABLE figures(night_id TEXT NOT NULL, model TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, "
        "PRIMARY KEY (night_id, model, name))",
    ),
    3: ("ALTER TABLE entries ADD COLUMN seconds REAL",),
    4: ("ALTER TABLE entries ADD COLUMN handed_out TEXT",),
}


@dataclass(frozen=True)
class GoodRun:
    """The last night whose gate passed for a model: the baseline of the next night."""

    night_id: str
    entry_run: str


TABLES_V1 = ("entries", "environments", "hashes", "nights", "runs", "verdicts")
TABLES_BY_VERSION = {1: TABLES_V1, 2: (*TABLES_V1, "figures"), 3: (*TABLES_V1, "figures"), 4: (*TABLES_V1, "figures")}
TABLES = TABLES_BY_VERSION[SCHEMA_VERSION]


def _version_error(path: Path, version: int) -> RunStoreError:
    return RunStoreError(f"history {path} has schema version {version}; this qconsist reads versions 1 to {SCHEMA_VERSION}")


def _utc(value: str, what: str) -> _dt.datetime:
    """``value`` (an ISO 8601 UTC time such as 2026-01-31T02:00:00Z; without a zone: UTC) as a naive UTC datetime."""
    try:
        parsed = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is not None and parsed.utcoffset() != _dt.timedelta(0):
        raise ConfigError(f"`{what}` must be a UTC time such as 2026-01-31T02:00:00Z, got {value!r}")
    return parsed.replace(tzinfo=None)


def _timestamp(value: str | None, what: str) -> str:
    """``value`` (an ISO 8601 UTC time such as 2026-01-31T02:00:00Z, as the history writes them; without a zone:
    UTC), else now."""
    if value is None:
        return utc_now()
    return _utc(value, what).isoformat(timespec="seconds") + "Z"


def _own_times(started: str, seconds: float | None) -> tuple[str, str]:
    """An entry's own start and finish (UTC, to the millisecond): ``started`` as the task measured it, and
    ``started + seconds``."""
    if seconds is None:
        raise ConfigError("`started` (the task's own start) needs its `seconds`: the entry's finish is its start plus them")
    start = _utc(started, "started")
    finish = start + _dt.timedelta(seconds=float(seconds))
    return (start.isoformat(timespec="milliseconds") + "Z", finish.isoformat(timespec="milliseconds") + "Z")


class History:
    """The history database at ``path`` (created on first use). ``read_only``: opened for reading only (the
    file, its mode and its journal are left as they are; a read-only file works), and it must already be a
    qconsist history. A database of another application is refused either way, never altered."""

    def __init__(self, path: Path | str, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.version = SCHEMA_VERSION  # what a reader found (an older version is read as it is)
        if read_only:
            self.version = self._check_reader()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {self.path.parent}: {exc.strerror or exc}") from None
        if self.path.is_file() and self.path.stat().st_size:
            self._check_reader(allow_empty=True)
        with self._connect() as conn, self._write(conn):
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # read again inside the transaction
            if version > SCHEMA_VERSION or version < 0:
                raise _version_error(self.path, version)
            if version == 0:
                for statement in _DDL_V1.strip().split(";"):
                    if statement.strip():
                        conn.execute(statement)
                version = 1
            for target in range(version + 1, SCHEMA_VERSION + 1):
                self._migrate(conn, target)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _migrate(self, conn: sqlite3.Connection, target: int) -> None:
        """Take the database from version ``target - 1`` to ``target`` (inside the caller's transaction)."""
        log.info("history %s: migrating to schema version %d", self.path, target)
        for statement in _MIGRATIONS[target]:
            conn.execute(statement)
        if target == 2:  # what version 1 kept only in the verdict's JSON
            for row in conn.execute("SELECT night_id, model, verdict FROM verdicts").fetchall():
                data = _json_object(row["verdict"])
                conn.execute("UPDATE verdicts SET origin_nodes = ? WHERE night_id = ? AND model = ?",
                             (json.dumps(list(data.get("origin_nodes") or [])), row["night_id"], row["model"]))
                for name, value in verdict_figures(data).items():
                    conn.execute("INSERT OR REPLACE INTO figures(night_id, model, name, value) VALUES (?,?,?,?)",
                                 (row["night_id"], row["model"], name, value))

    def _check_reader(self, allow_empty: bool = False) -> int:
        """The file is an SQLite database holding qconsist's tables at a schema version this qconsist reads;
        that version (0: an empty file a writer may start)."""
        try:
            with open(self.path, "rb") as handle:
                magic = handle.read(16)
        except OSError as exc:
            raise RunStoreError(f"cannot read history database {self.path}: {exc.strerror or exc}") from None
        if magic != b"SQLite format 3\x00" and not allow_empty:  # the writer says "unusable: file is not a database"
            raise RunStoreError(f"{self.path} is not a qconsist history database (not an SQLite file)")
        with self._connect() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        if version != 0 and version not in TABLES_BY_VERSION:
            raise _version_error(self.path, version)
        if allow_empty and version == 0 and not tables:
            return 0
        if version not in TABLES_BY_VERSION or set(tables) != set(TABLES_BY_VERSION[version]):
            raise RunStoreError(
                f"{self.path} is not a qconsist history database (schema version {version}, tables: "
                f"{', '.join(tables) or 'none'}); give the file that qconsist nightly writes"
            )
        return version

    # -- connection handling -------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        if not self.read_only:
            return sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            conn.execute("PRAGMA user_version").fetchone()
            return conn
        except sqlite3.OperationalError:  # a WAL database in a folder it cannot write: nobody writes it either
            return sqlite3.connect(f"{uri}&immutable=1", uri=True, isolation_level=None)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = self._open()
        except sqlite3.Error as exc:
            raise OutputError(f"cannot open history database {self.path}: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if not self.read_only:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            conn.row_factory = sqlite3.Row
            yield conn
        except sqlite3.DatabaseError as exc:
            if "readonly" in str(exc).replace("read-only", "readonly").replace(" ", ""):
                raise OutputError(f"history database {self.path} is read-only ({exc}): recording needs a writable file "
                                  "and folder; give another one with --history") from None
            raise RunStoreError(f"history database {self.path} is unusable: {exc}") from None
        finally:
            conn.close()

    @contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _execute(self, statements: list[tuple[str, tuple]]) -> None:
        with self._connect() as conn, self._write(conn):
            for sql, params in statements:
                conn.execute(sql, params)

    # -- writing -------------------------------------------------------------------------------------------
    # Times are now unless given (``started``, ``finished``: UTC, e.g. 2026-01-31T02:00:00Z): a history built
    # for a test or carried over from elsewhere records its nights on their own dates.
    def start_night(self, night_id: str, config: str, environment: dict[str, Any], started: str | None = None) -> None:
        text = json.dumps(environment, sort_keys=True, default=str)
        sha = hashlib.sha256(text.encode()).hexdigest()
        self._execute([
            ("INSERT OR IGNORE INTO environments(sha, data) VALUES (?, ?)", (sha, text)),
            ("INSERT INTO nights(night_id, config, started, status, pid, host, environment_sha) VALUES (?,?,?,?,?,?,?)",
             (night_id, config, _timestamp(started, "started"), "running", os.getpid(), socket.gethostname(), sha)),
        ])

    def finish_night(self, night_id: str, summary: dict[str, Any], finished: str | None = None) -> None:
        self._execute([(
            "UPDATE nights SET status = 'complete', finished = ?, summary = ? WHERE night_id = ?",
            (_timestamp(finished, "finished"), json.dumps(summary, default=str), night_id),
        )])

    def abandoned(self) -> list[str]:
        """Nights still ``running`` whose process is gone (read only)."""
        with self._connect() as conn:
            rows = conn.execute("SELECT night_id, pid, host FROM nights WHERE status = 'running'").fetchall()
        host = socket.gethostname()
        return [r["night_id"] for r in rows if r["host"] == host and not process_alive(r["pid"])]

    def mark_abandoned(self, config: str | None = None) -> list[str]:
        """Mark nights still ``running`` whose process is gone as ``incomplete``; return their ids."""
        dead = self.abandoned()
        statements = []
        for night in dead:
            statements += _incomplete(night)
        if statements:
            self._execute(statements)
        return dead

    def interrupt_night(self, night_id: str) -> None:
        """Mark a night its own process stops (Ctrl-C) ``incomplete`` now, its unfinished entries ``night
        interrupted``, exactly as the next nightly would mark it had the process been killed."""
        self._execute(_incomplete(night_id))

    def start_entry(self, night_id: str, model: str, started: str | None = None) -> None:
        """A task handed out (``started``: when; default now): the entry is ``running``, its ``started`` and
        ``handed_out`` that time until ``finish_entry`` records the task's own start."""
        when = _timestamp(started, "started")
        self._execute([(
            "INSERT OR REPLACE INTO entries(night_id, model, status, started, handed_out) VALUES (?, ?, 'running', ?, ?)",
            (night_id, model, when, when),
        )])

    def record_run(self, night_id: str, model: str, role: str, run_id: str, kind: str, path: Path | str) -> None:
        self._execute([(
            "INSERT OR REPLACE INTO runs(night_id, model, role, run_id, kind, path, recorded) VALUES (?,?,?,?,?,?,?)",
            (night_id, model, role, run_id, kind, str(path), utc_now()),
        )])

    def record_hashes(self, night_id: str, model: str, stages: list[dict[str, Any]]) -> None:
        statements = []
        for stage in stages:
            artifact = stage.get("artifact") or {}
            statements.append((
                "INSERT OR REPLACE INTO hashes(night_id, model, stage, md5, sha256, content) VALUES (?,?,?,?,?,?)",
                (night_id, model, stage["name"], artifact.get("md5"), artifact.get("sha256"), artifact.get("content")),
            ))
        if statements:
            self._execute(statements)

    def finish_entry(self, night_id: str, model: str, entry_run: str | None, verdict: Any | None, baseline_night: str | None,
                     error: str | None = None, *, gpu_type: str | None = None, gpus: tuple[str, ...] | list[str] = (),
                     finished: str | None = None, seconds: float | None = None, started: str | None = None) -> None:
        """Close a model's entry: its verdict (a ``GateVerdict``) and the figures it measured, or the error that
        stopped it, the GPU type it asked for and the GPUs (names) it ran on, and the task's own wall ``seconds``
        (``None``: not measured: it never ran), in one transaction. ``started``: the task's own start, where it ran
        (``EntryOutcome.started``); the entry's ``started`` and ``finished`` become that start and that start plus
        ``seconds`` (its ``handed_out`` keeps the hand-out). Without it the entry keeps its hand-out time as
        ``started`` and ``finished`` is when it is recorded. ``finished``: when it is recorded (default now)."""
        recorded = _timestamp(finished, "finished")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0):
            raise ConfigError(f"`seconds` must be a number of seconds >= 0, got {seconds!r}")
        times = ("started = ?, finished = ?", _own_times(started, seconds)) if started is not None else ("finished = ?", (recorded,))
        statements: list[tuple[str, tuple]] = [(
            f"UPDATE entries SET status = ?, error = ?, entry_run = ?, {times[0]}, gpu_type = ?, gpus = ?, seconds = ? "
            "WHERE night_id = ? AND model = ?",
            ("error" if error else "done", error, entry_run, *times[1], gpu_type, json.dumps([str(g) for g in gpus]),
             None if seconds is None else float(seconds), night_id, model),
        )]
        if verdict is not None:
            data = verdict.to_json()
            statements.append((
                "INSERT OR REPLACE INTO verdicts(night_id, model, passed, baseline_night, changed_stages, "
                "first_diverging_node, reasons, verdict, recorded, origin_nodes) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (night_id, model, int(verdict.passed), baseline_night, json.dumps(data["changed_stages"]),
                 data["first_diverging_node"], json.dumps(data["reasons"]), json.dumps(data), recorded,
                 json.dumps(list(data.get("origin_nodes") or []))),
            ))
            statements += _figure_rows(night_id, model, verdict_figures(data))
        self._execute(statements)

    def record_figures(self, night_id: str, model: str, figures: dict[str, float]) -> None:
        """Record figures of a model's night beside the verdict's (``qconsist.history.figures``: the run accuracy,
        say, as ``{"accuracy.top1": 0.91, "accuracy.top5": 0.99}``); a figure recorded again is replaced."""
        statements = _figure_rows(night_id, model, check_figures(figures))
        if statements:
            self._execute(statements)

    # -- reading -------------------------------------------------------------------------------------------
    # Nights are ordered by insertion (the table's rowid): start times have a resolution of one second, and
    # two nights can start within the same second (a killed night and its rerun).
    def last_good(self, model: str, before: str | None = None) -> GoodRun | None:
        """The most recent complete entry of ``model`` whose gate passed (excluding night ``before``)."""
        runs = self.good_runs(model, before, limit=1)
        return runs[0] if runs else None

    def good_runs(self, model: str, before: str | None = None, limit: int = 20) -> list[GoodRun]:
        """The ``limit`` most recent complete entries of ``model`` whose gate passed, newest first (excluding
        night ``before``): the baselines a nightly entry chooses from (like with like: ``qconsist.nightly``)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT e.night_id, e.entry_run FROM entries e JOIN verdicts v USING (night_id, model) "
                "JOIN nights n USING (night_id) "
                "WHERE e.model = ? AND e.status = 'done' AND v.passed = 1 AND e.night_id != ? "
                "ORDER BY n.rowid DESC LIMIT ?",
                (model, before or "", limit),
            ).fetchall()
        return [GoodRun(row["night_id"], row["entry_run"]) for row in rows]

    def last_seconds(self, model: str, before: str | None = None) -> float | None:
        """The task's own wall seconds of ``model``'s most recent entry that finished (``done``: it reached a verdict,
        pass or fail; excluding night ``before``); ``None`` where no such entry measured them (a new model, or a
        history older than version 3). An entry that stopped with an error is not counted: it may have stopped
        early, and its seconds say nothing of the entry's length."""
        if self.version < 3:
            return None
        with self._connect() as conn:
            row = conn.execute(
                "SELECT e.seconds FROM entries e JOIN nights n USING (night_id) "
                "WHERE e.model = ? AND e.status = 'done' AND e.seconds IS NOT NULL AND e.night_id != ? "
                "ORDER BY n.rowid DESC LIMIT 1",
                (model, before or ""),
            ).fetchone()
        return None if row is None else float(row["seconds"])

    def nights(self) -> list[dict[str, Any]]:
        with self._connect() as conn:
            return [dict(r) for r in conn.execute("SELECT * FROM nights ORDER BY rowid")]

    def models(self) -> list[str]:
        with self._connect() as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT model FROM entries ORDER BY model")]

    def model_rows(self, model: str) -> list[dict[str, Any]]:
        """Every night of ``model``, oldest first, with its hashes, verdict, figures, GPUs and environment (a
        version-1 file: figures and origin nodes from the verdict's JSON, GPUs from the night's environment)."""
        old = self.version < 2
        with self._connect() as conn:
            entries = conn.execute(
                "SELECT e.*, n.status AS night_status, n.started AS night_started, n.environment_sha, env.data AS environment "
                "FROM entries e JOIN nights n USING (night_id) LEFT JOIN environments env ON env.sha = n.environment_sha "
                "WHERE e.model = ? ORDER BY n.rowid",
                (model,),
            ).fetchall()
            rows = []
            for entry in entries:
                row = dict(entry)
                row.setdefault("seconds", None)  # a version-1 or version-2 file: not measured
                row.setdefault("handed_out", None)  # a file older than version 4: started is the hand-out time
                key = (entry["night_id"], model)
                row["environment"] = json.loads(row["environment"]) if row["environment"] else {}
                row["hashes"] = {
                    h["stage"]: {"md5": h["md5"], "sha256": h["sha256"], "content": h["content"]}
                    for h in conn.execute("SELECT * FROM hashes WHERE night_id = ? AND model = ?", key)
                }
                columns = "verdict" if old else "origin_nodes"
                verdict = conn.execute(
                    "SELECT passed, baseline_night, changed_stages, first_diverging_node, reasons, "
                    f"{columns} FROM verdicts WHERE night_id = ? AND model = ?", key).fetchone()
                data = _json_object(verdict["verdict"]) if old and verdict is not None else {}
                row["verdict"] = None if verdict is None else {
                    "passed": bool(verdict["passed"]), "baseline_night": verdict["baseline_night"],
                    "changed_stages": json.loads(verdict["changed_stages"]),
                    "first_diverging_node": verdict["first_diverging_node"], "reasons": json.loads(verdict["reasons"]),
                    "origin_nodes": list(data.get("origin_nodes") or []) if old else json.loads(verdict["origin_nodes"] or "[]"),
                }
                row["figures"] = verdict_figures(data) if old else {
                    f["name"]: f["value"] for f in conn.execute("SELECT name, value FROM figures WHERE night_id = ? AND model = ?", key)}
                row["gpu_type"] = row.get("gpu_type") or (model.rsplit("@", 1)[1] if "@" in model else None)
                recorded = row.get("gpus")
                row["gpus"] = json.loads(recorded) if recorded is not None else [
                    str(g.get("name")) for g in row["environment"].get("gpus") or [] if isinstance(g, dict)]
                row["runs"] = {
                    r["role"]: r["path"]
                    for r in conn.execute("SELECT role, path FROM runs WHERE night_id = ? AND model = ?", key)
                }
                rows.append(row)
        return rows


def _figure_rows(night_id: str, model: str, figures: dict[str, float]) -> list[tuple[str, tuple]]:
    return [("INSERT OR REPLACE INTO figures(night_id, model, name, value) VALUES (?,?,?,?)", (night_id, model, name, value))
            for name, value in figures.items()]


def _json_object(text: str | None) -> dict[str, Any]:
    """A verdict's JSON as recorded ({} where it is not an object: a damaged row is shown without figures)."""
    try:
        data = loads(text or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _incomplete(night_id: str) -> list[tuple[str, tuple]]:
    return [("UPDATE nights SET status = 'incomplete', finished = ? WHERE night_id = ?", (utc_now(), night_id)),
            ("UPDATE entries SET status = 'error', error = 'night interrupted', finished = ? "
             "WHERE night_id = ? AND status = 'running'", (utc_now(), night_id))]


def baseline_runs(path: Path | str | None) -> set[str]:
    """Names of the run directories the history at ``path`` holds as baselines: each model's last night whose
    gate passed, its entry run and every run that night recorded for the model. No database: none."""
    if path is None or not Path(path).is_file() or not Path(path).stat().st_size:
        return set()
    db = History(path, read_only=True)  # reading never writes: no table, journal or mode changes
    names: set[str] = set()
    for model in db.models():
        good = db.last_good(model)
        if good is None:
            continue
        names.add(Path(good.entry_run).name)
        for row in db.model_rows(model):
            if row.get("night_id") == good.night_id:
                names.update(Path(p).name for p in (row.get("runs") or {}).values() if p)
    return names
