"""Crash-safe store: one SQLite file in WAL mode per writing process, readable while it is written.

WAL with synchronous=NORMAL makes every commit survive the writer's death (kill -9): committed pages
sit in the -wal file, which any later reader replays. Writers never share a file, so they need no locks
between them; readers never block writers.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, start REAL, "end" REAL,
                                  data_wait REAL, samples REAL, gpu_time REAL);
CREATE TABLE IF NOT EXISTS system (time REAL, metric TEXT, device TEXT, value REAL);
CREATE TABLE IF NOT EXISTS processes (time REAL, pid INTEGER, role TEXT, cpu REAL, rss REAL);
CREATE TABLE IF NOT EXISTS workers (pid INTEGER PRIMARY KEY, time REAL);
CREATE TABLE IF NOT EXISTS phases (step INTEGER PRIMARY KEY, forward REAL, backward REAL,
                                   optimizer REAL);
CREATE TABLE IF NOT EXISTS cpu_phases (step INTEGER PRIMARY KEY, data_wait REAL,
                                       data_wait_ready REAL);
CREATE TABLE IF NOT EXISTS gpu_phases (step INTEGER PRIMARY KEY, forward REAL, backward REAL,
                                       optimizer REAL);
CREATE TABLE IF NOT EXISTS evals (start REAL, "end" REAL, batches INTEGER, samples REAL,
                                  data_wait REAL);
"""

TABLES = {
    "steps": ("step", "start", "end", "data_wait", "samples", "gpu_time"),
    "system": ("time", "metric", "device", "value"),
    "processes": ("time", "pid", "role", "cpu", "rss"),
    "workers": ("pid", "time"),
    "phases": ("step", "forward", "backward", "optimizer"),
    "cpu_phases": ("step", "data_wait", "data_wait_ready"),
    "gpu_phases": ("step", "forward", "backward", "optimizer"),
    "evals": ("start", "end", "batches", "samples", "data_wait"),
}


class Store:
    """The writer of one store file. Not thread-safe: one thread writes at a time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(
            self.path, timeout=5.0, isolation_level=None, check_same_thread=False
        )
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def write(
        self,
        info: dict[str, Any] | None = None,
        gpu_times: Sequence[tuple[float, int]] = (),
        **rows: Iterable[Sequence[Any]],
    ) -> None:
        """Append rows to tables (keyword = table name), update info and step GPU times, in one commit."""
        db = self._db
        db.execute("BEGIN")
        try:
            for table, data in rows.items():
                cols = TABLES[table]
                marks = ",".join("?" * len(cols))
                keyed = table in ("steps", "workers", "phases", "cpu_phases", "gpu_phases")
                verb = "INSERT OR REPLACE" if keyed else "INSERT"
                db.executemany(f"{verb} INTO {table} VALUES ({marks})", data)
            if gpu_times:
                db.executemany("UPDATE steps SET gpu_time=? WHERE step=?", gpu_times)
            if info:
                db.executemany(
                    "INSERT OR REPLACE INTO info VALUES (?, ?)",
                    [(k, json.dumps(v)) for k, v in info.items()],
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the file (SQLite folds the WAL back into it)."""
        self._db.close()


def read_store(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything in one store file: {"info": dict, table: list of row tuples}; tables may be empty.

    Works on a file still being written and on one whose writer was killed (the WAL is replayed).
    """
    db = _open_for_reading(Path(path))
    try:
        return read_tables(db)
    finally:
        db.close()


def read_tables(db: sqlite3.Connection) -> dict[str, Any]:
    """What `read_store` returns, from an open store connection (however it was opened)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    out: dict[str, Any] = {"info": {}}
    if "info" in tables:
        out["info"] = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM info")}
    for table, cols in TABLES.items():
        if table in tables:
            # a column an older writer did not have reads as NULL (a double-quoted name SQLite
            # cannot resolve would be read as a string literal)
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            picked = ",".join(f'"{c}"' if c in have else "NULL" for c in cols)
            out[table] = db.execute(f"SELECT {picked} FROM {table}").fetchall()
        else:
            out[table] = []
    return out


def _open_for_reading(path: Path) -> sqlite3.Connection:
    # A normal connection can replay the WAL of a killed writer; where the directory is read-only,
    # fall back to a read-only one.
    try:
        db = sqlite3.connect(path, timeout=5.0)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
