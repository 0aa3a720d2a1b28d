"""The store: one SQLite WAL file per writer, readable while written and after its writer is killed."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap

from gpufeed.profiler.store import Store, read_store


def test_rows_and_info_round_trip(tmp_path):
    store = Store(tmp_path / "s.db")
    store.write({"host": "h", "rank": 3}, steps=[(0, 1.0, 2.0, 0.5, 8.0, math.nan)])
    store.write(gpu_times=[(0.25, 0)], system=[(1.5, "cpu.util", "", 50.0)])
    store.write(processes=[(1.5, 42, "main", 99.0, 1e6)], workers=[(43, 1.5)])
    data = read_store(tmp_path / "s.db")
    assert data["info"] == {"host": "h", "rank": 3}
    assert data["steps"] == [(0, 1.0, 2.0, 0.5, 8.0, 0.25)]
    assert data["system"] == [(1.5, "cpu.util", "", 50.0)]
    assert data["processes"] == [(1.5, 42, "main", 99.0, 1e6)]
    assert data["workers"] == [(43, 1.5)]
    store.close()


def test_a_reader_sees_commits_while_the_writer_is_still_open(tmp_path):
    store = Store(tmp_path / "s.db")
    for i in range(3):
        store.write(steps=[(i, float(i), i + 1.0, 0.0, 1.0, None)])
        assert len(read_store(tmp_path / "s.db")["steps"]) == i + 1
    store.close()


def test_an_empty_file_reads_as_empty_tables(tmp_path):
    (tmp_path / "e.db").write_bytes(b"")
    data = read_store(tmp_path / "e.db")
    assert data["info"] == {} and data["steps"] == [] and data["system"] == []


WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from gpufeed.profiler.store import Store
    path, n, die = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "die"
    s = Store(path)
    s.write({"pid": os.getpid()})
    for i in range(n):
        s.write(steps=[(i, float(i), i + 0.5, 0.1, 4.0, None)])
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    s.close()
    """
)


def test_commits_survive_a_killed_writer_and_writers_need_no_shared_lock(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(tmp_path / f"w{i}.db"), "200", mode])
        for i, mode in enumerate(["die", "die", "close"])
    ]
    codes = [p.wait(timeout=60) for p in procs]
    assert codes == [-signal.SIGKILL, -signal.SIGKILL, 0]
    assert os.path.exists(tmp_path / "w0.db-wal")  # the killed writer never checkpointed
    for i in range(3):
        data = read_store(tmp_path / f"w{i}.db")
        assert [r[0] for r in data["steps"]] == list(range(200))


def test_only_the_store_module_opens_sqlite_files():
    """All reading (and writing) of store files is `profiler.store`'s: no other module of the
    package imports sqlite3, so the read-only and killed-writer handling cannot be bypassed."""
    import ast
    from pathlib import Path

    import gpufeed

    package = Path(gpufeed.__file__).parent
    users = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "sqlite3" or n.startswith("sqlite3.") for n in names):
                users.add(path.relative_to(package).as_posix())
    assert users == {"profiler/store.py"}


def test_read_store_writes_nothing_beside_a_store_it_may_not_write(tmp_path, monkeypatch):
    """Without write access (a read-only mount, someone else's run) the store is read read-only:
    no -wal or -shm file appears beside it."""
    import gpufeed.profiler.store as store_module

    store = Store(tmp_path / "s.db")
    store.write({"host": "h"}, steps=[(0, 1.0, 2.0, 0.5, 8.0, None)])
    store.close()
    before = sorted(os.listdir(tmp_path))
    monkeypatch.setattr(store_module.os, "access", lambda path, mode: mode != os.W_OK)
    assert len(read_store(tmp_path / "s.db")["steps"]) == 1
    assert sorted(os.listdir(tmp_path)) == before
