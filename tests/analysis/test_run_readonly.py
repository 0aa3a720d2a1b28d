"""`gpufeed.load` on a run directory that cannot be written: a read-only mount, or a copy of
someone else's run. SQLite's normal connection fails there on the WAL-mode store files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import gpufeed
from gpufeed.profiler import store as store_module
from gpufeed.profiler.session import steps_store_path
from gpufeed.profiler.store import Store

STEPS = {0: [(i, 1010.0 + i, 1011.0 + i, 0.25, 16.0, None) for i in range(4)]}
CPU = [(1000.0 + i, "cpu.util", "", 10.0) for i in range(5)]


def _mount_readonly(src: Path, dst: Path) -> str | None:
    """Bind-mount `src` read-only at `dst`; None on success, else why not."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "a read-only bind mount needs root and mount(8)"
    dst.mkdir()
    cp = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True, text=True)
    if cp.returncode:
        return f"mount --bind is not permitted here: {cp.stderr.strip()}"
    cp = subprocess.run(
        ["mount", "-o", "remount,ro,bind", str(dst)], capture_output=True, text=True
    )
    if cp.returncode:
        _umount(dst)
        return f"remounting read-only is not permitted here: {cp.stderr.strip()}"
    return None


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def readonly(tmp_path):
    """`readonly(run_dir) -> path`: the directory seen through a read-only bind mount (root can
    write through chmod, not through a read-only mount); skips where mounting is not permitted."""
    mounts: list[Path] = []

    def view(src: Path) -> Path:
        dst = tmp_path / f"readonly-{len(mounts)}"
        why = _mount_readonly(src, dst)
        if why:
            pytest.skip(why)
        mounts.append(dst)
        assert not os.access(dst, os.W_OK)
        return dst

    yield view
    for m in reversed(mounts):
        _umount(m)


def _leftovers_of_a_killed_writer(make_run, tmp_path: Path, shm: bool) -> Path:
    """A run whose rank-1 writer died: its store is a database plus a -wal (and -shm) file."""
    run_dir = make_run(ranks=STEPS, system=CPU)
    copy = tmp_path / "killed"
    shutil.copytree(run_dir, copy)
    store = steps_store_path(run_dir, "h1", 555)
    writer = Store(store)
    try:
        writer.write(
            {"host": "h1", "rank": 1, "pid": 555}, steps=[(0, 1010.0, 1012.0, 0.5, 8.0, None)]
        )
        suffixes = ["", "-wal", "-shm"] if shm else ["", "-wal"]
        for suffix in suffixes:
            shutil.copyfile(f"{store}{suffix}", copy / f"{store.name}{suffix}")
    finally:
        writer.close()
    assert (copy / f"{store.name}-wal").stat().st_size > 0
    return copy


def _check(run_dir: Path, ranks: int) -> None:
    before = sorted(os.listdir(run_dir))
    run = gpufeed.load(run_dir)
    assert run.steps.groupby("rank").ngroups == ranks
    assert len(run.steps[run.steps["rank"] == 0]) == 4 and len(run.system) == 5
    assert sorted(os.listdir(run_dir)) == before  # nothing was written next to the stores


def test_load_a_finished_run_on_a_read_only_mount(make_run, readonly):
    _check(readonly(make_run(ranks=STEPS, system=CPU)), ranks=1)


def test_load_a_killed_run_on_a_read_only_mount(make_run, readonly, tmp_path):
    _check(readonly(_leftovers_of_a_killed_writer(make_run, tmp_path, shm=True)), ranks=2)


def test_load_a_killed_run_without_its_shm_file_on_a_read_only_mount(make_run, readonly, tmp_path):
    # No -shm file, and a read-only directory cannot get one: the WAL is replayed in a copy.
    _check(readonly(_leftovers_of_a_killed_writer(make_run, tmp_path, shm=False)), ranks=2)


@pytest.mark.parametrize("killed", [False, True])
def test_load_without_write_access_never_opens_a_store_for_writing(
    make_run, tmp_path, monkeypatch, killed
):
    # The same paths without a mount: what root cannot be denied by chmod is simulated by
    # access() saying "not writable", and the normal (writing) reader must not be used.
    run_dir = (
        _leftovers_of_a_killed_writer(make_run, tmp_path, shm=True)
        if killed
        else make_run(ranks=STEPS, system=CPU)
    )
    monkeypatch.setattr(store_module.os, "access", lambda path, mode: mode != os.W_OK)

    def no_writer(path):
        raise AssertionError(f"opened {path} with a writing connection")

    monkeypatch.setattr(store_module, "_read_in_place", no_writer)
    _check(run_dir, ranks=2 if killed else 1)
