"""Crash-safe store: one SQLite file in WAL mode per writing process, readable while it is written.
The one module that opens store files: `Store` writes one, `read_store` reads one (also a killed
writer's, also on a read-only mount).

WAL with synchronous=NORMAL makes every commit survive the writer's death (kill -9): committed pages
sit in the -wal file, which any later reader replays. Writers never share a file, so they need no locks
between them; readers never block writers.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
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

    The one reader of store files. Works on a file still being written and on one whose writer was
    killed (its WAL is replayed), also where the run directory or its files cannot be written (a
    read-only mount, a copy owned by someone else), where a normal SQLite connection fails on a
    WAL database: there nothing is written next to the file.
    """
    path = Path(path)
    if _writable(path):
        try:
            return _read_in_place(path)
        except sqlite3.OperationalError:
            pass  # e.g. a file system that is read-only although access() says otherwise
    return _read_readonly(path)


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


def _read_in_place(path: Path) -> dict[str, Any]:
    """`read_store` through a normal connection, which replays the WAL of a killed writer (and may
    create the -wal and -shm files beside the store to do so)."""
    return _read_connected(sqlite3.connect(path, timeout=5.0))


def _sidecars(path: Path) -> tuple[Path, Path]:
    """The WAL and shared-memory files SQLite keeps next to a WAL-mode database."""
    return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def _writable(path: Path) -> bool:
    files = [path.parent, path, *(p for p in _sidecars(path) if p.exists())]
    return all(os.access(p, os.W_OK) for p in files)


def _read_readonly(path: Path) -> dict[str, Any]:
    """Read a store without writing anything next to it.

    Without a WAL (the writer closed the file, folding the WAL in) `immutable=1` opens the file as
    it is; `mode=ro` reads the WAL of a live or killed writer where its -wal and -shm files exist; a
    WAL that cannot be read in place (no -shm file, which a read-only directory cannot get) is
    replayed in a private copy.
    """
    wal, _ = _sidecars(path)
    has_wal = wal.exists() and wal.stat().st_size > 0
    uri = path.resolve().as_uri()
    # Without a WAL no writer is at work (stores are WAL-mode while open) and the file is complete:
    # immutable=1 reads it without locks and without creating -wal/-shm files.
    modes = ["mode=ro"] if has_wal else ["immutable=1", "mode=ro"]
    error: Exception | None = None
    for mode in modes:
        try:
            return _read_uri(f"{uri}?{mode}")
        except sqlite3.Error as e:
            error = error or e
    if not has_wal:
        assert error is not None
        raise error
    with tempfile.TemporaryDirectory(prefix="gpufeed-store-") as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        shutil.copyfile(wal, _sidecars(copy)[0])
        return _read_in_place(copy)


def _read_uri(uri: str) -> dict[str, Any]:
    """What `read_store` returns, from a SQLite URI (read-only modes)."""
    return _read_connected(sqlite3.connect(uri, uri=True, timeout=5.0))


def _read_connected(db: sqlite3.Connection) -> dict[str, Any]:
    """`read_tables` of `db`, which is closed afterwards."""
    try:
        return read_tables(db)
    finally:
        db.close()
