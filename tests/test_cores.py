"""The cores a job may use: its affinity set, capped by its container's CPU limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufeed import cores
from gpufeed.cores import (
    allowed_cores,
    cgroup_memory_used,
    cpu_quota,
    memory_cgroup,
    memory_limit,
    usable_cores,
)
from gpufeed.profiler.session import machine_meta


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "1600000 100000\n"}, 16),
        ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: two cores are kept busy part of the time
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "800000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "garbage\n"}, None),
        ({}, None),
    ],
)
def test_the_container_cpu_limit_is_read_from_cgroup_v2_or_v1(
    tmp_path: Path, files: dict[str, str], quota: int | None
) -> None:
    assert cpu_quota(_cgroup(tmp_path, files)) == quota


@pytest.mark.parametrize(
    ("membership", "quota"),
    [
        ("0::/batch.slice/job-7.scope\n", 4),  # the job's own cgroup, below an 8-CPU slice
        ("0::/batch.slice\n", 8),
        ("0::/\n", 16),  # a container's namespace: its own cgroup is the root
        ("0::/../../other.slice\n", 16),  # outside this namespace: only the root is read
        ("0::/docker/abc\n", 16),  # not mounted here: the root, which is the container's
        ("4:cpu,cpuacct:/batch.slice\n0::/\n", 2),  # v1's cpu hierarchy
    ],
)
def test_the_tightest_limit_on_the_way_from_the_process_cgroup_to_the_root_wins(
    tmp_path: Path, membership: str, quota: int
) -> None:
    root = _cgroup(
        tmp_path,
        {
            "cpu.max": "1600000 100000\n",
            "batch.slice/cpu.max": "800000 100000\n",
            "batch.slice/job-7.scope/cpu.max": "400000 100000\n",
            "cpu/batch.slice/cpu.cfs_quota_us": "200000\n",
            "cpu/batch.slice/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cpu_quota(root, membership) == quota


def test_a_container_limit_caps_the_usable_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cores, "CGROUP_ROOT", _cgroup(tmp_path, {"cpu.max": "100000 100000"}))
    assert usable_cores() == 1
    monkeypatch.setattr(cores, "CGROUP_ROOT", _cgroup(tmp_path / "big", {"cpu.max": "max 100000"}))
    assert usable_cores() == len(allowed_cores())


@pytest.mark.parametrize(
    ("files", "membership", "limit"),
    [
        ({"memory.max": "68719476736\n"}, "0::/\n", 64 << 30),
        ({"memory.max": "max\n"}, "0::/\n", None),
        ({"memory.max": "max\n", "job/memory.max": "1073741824\n"}, "0::/job\n", 1 << 30),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, "5:memory:/\n", None),
        ({"memory/k8s/memory.limit_in_bytes": "2147483648\n"}, "5:memory:/k8s\n", 2 << 30),
        ({"memory.max": "garbage\n"}, "0::/\n", None),
        ({}, "0::/\n", None),
    ],
)
def test_the_container_memory_limit_is_read_from_cgroup_v2_or_v1(
    tmp_path: Path, files: dict[str, str], membership: str, limit: int | None
) -> None:
    assert memory_limit(_cgroup(tmp_path, files), membership) == limit


@pytest.mark.parametrize(
    ("files", "used"),
    [
        ({"memory.current": "3000\n", "memory.stat": "anon 2000\ninactive_file 700\n"}, 2300),
        ({"memory.usage_in_bytes": "3000\n", "memory.stat": "total_inactive_file 1000\n"}, 2000),
        ({"memory.current": "3000\n"}, 3000),  # no memory.stat: all of it counts
        ({"memory.current": "garbage\n"}, None),
        ({}, None),
    ],
)
def test_a_cgroups_working_set_leaves_out_its_inactive_page_cache(
    tmp_path: Path, files: dict[str, str], used: int | None
) -> None:
    assert cgroup_memory_used(_cgroup(tmp_path, files)) == used


def test_the_binding_memory_cgroup_is_the_tightest_on_the_way_up(tmp_path: Path) -> None:
    root = _cgroup(tmp_path, {"memory.max": "4096\n", "pod/memory.max": "max\n"})
    assert memory_cgroup(root, "0::/pod/ctr\n") == (root, 4096)
    assert memory_cgroup(_cgroup(tmp_path / "none", {}), "0::/\n") is None


def test_a_container_memory_limit_caps_the_machines_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    from gpufeed.data.budget import default_max_host_bytes, machine_memory

    monkeypatch.setattr(cores, "CGROUP_ROOT", _cgroup(tmp_path, {"memory.max": "1073741824\n"}))
    monkeypatch.setattr(cores, "memory_limit", lambda: memory_limit(membership="0::/\n"))
    assert machine_memory() == min(1 << 30, psutil.virtual_memory().total)
    assert default_max_host_bytes() == machine_memory() // 4


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_job_pinned_to_one_core_counts_one_core_and_records_it_in_its_run() -> None:
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(saved)})
        assert allowed_cores() == [min(saved)]
        assert usable_cores() == 1
        assert machine_meta()["cpu_count"] == 1
    finally:
        os.sched_setaffinity(0, saved)
    assert usable_cores() == min(len(saved), cpu_quota() or len(saved))
