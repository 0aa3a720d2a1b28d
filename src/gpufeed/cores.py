"""The CPU cores this process may use: one count for every sizing decision (loader workers,
model threads, the profiler's advice), so that a job pinned to 16 cores of a 64-core host (Slurm,
a Docker cpuset) or limited to 16 CPUs by its container (a Kubernetes CPU limit) is advised for
16 cores, not 64."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = [
    "allowed_cores",
    "cgroup_memory_used",
    "cores_per_rank",
    "cpu_quota",
    "memory_cgroup",
    "memory_limit",
    "usable_cores",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity set; every core where that is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_quota(root: Path | None = None, membership: str | None = None) -> int | None:
    """This process's CPU limit in whole cores, rounded up: the tightest `cpu.max` (cgroup v2) or
    `cpu.cfs_quota_us` / `cpu.cfs_period_us` (v1) on the path from its own cgroup (named in
    /proc/self/cgroup, or `membership`) up to the root; None where there is none or none can be
    read. Inside a container the root is usually the container's own cgroup; on a bare host a
    systemd slice or a batch job's cgroup sits below it."""
    found = _own_cgroups(root or CGROUP_ROOT, _membership(membership), "cpu")
    quotas = [q for d in found if (q := _quota(d)) is not None]
    return min(quotas, default=None)


def memory_limit(root: Path | None = None, membership: str | None = None) -> int | None:
    """This process's memory limit in bytes: the tightest `memory.max` (cgroup v2) or
    `memory.limit_in_bytes` (v1) from its own cgroup up to the root, as `cpu_quota`; None where
    there is none or none can be read."""
    found = memory_cgroup(root, membership)
    return found[1] if found else None


def memory_cgroup(
    root: Path | None = None, membership: str | None = None
) -> tuple[Path, int] | None:
    """(folder, limit in bytes) of the cgroup whose memory limit binds this process (the
    tightest from its own up, as `memory_limit`); None where none is set or readable."""
    found = _own_cgroups(root or CGROUP_ROOT, _membership(membership), "memory")
    limits = [(n, d) for d in found if (n := _memory(d)) is not None]
    if not limits:
        return None
    limit, folder = min(limits, key=lambda x: x[0])
    return folder, limit


def cgroup_memory_used(folder: Path) -> int | None:
    """The working set of the cgroup in `folder`: its memory use (`memory.current`, v1
    `memory.usage_in_bytes`) less its inactive page cache, which the kernel reclaims before it
    kills for want of memory (what `kubectl top` and `docker stats` show); None where unreadable."""
    for usage_name, inactive_name in (
        ("memory.current", "inactive_file"),
        ("memory.usage_in_bytes", "total_inactive_file"),
    ):
        try:
            usage = int((folder / usage_name).read_text())
        except (OSError, ValueError):
            continue
        inactive = 0
        try:
            for line in (folder / "memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_name:
                    inactive = int(value)
                    break
        except (OSError, ValueError):
            pass
        return max(0, usage - inactive)
    return None


def _membership(given: str | None) -> str:
    """/proc/self/cgroup (the cgroups this process is in) unless `given`; "" where unreadable."""
    if given is not None:
        return given
    try:
        return Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""


def _own_cgroups(root: Path, membership: str, controller: str) -> list[Path]:
    """The cgroup folders that limit this process's `controller` ("cpu", "memory"): its own
    and each parent, to the root."""
    v2, v1 = "/", "/"
    for line in membership.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":
            v2 = path or "/"
        elif controller in controllers.split(","):
            v1 = path or "/"
    found = []
    for base, path in ((root, v2), (root / controller, v1)):
        parts = Path(path.strip()).parts[1:] if path.strip().startswith("/") else ()
        if ".." in parts:  # a cgroup outside this namespace: only the root is ours to read
            parts = ()
        found += [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return found


def _quota(folder: Path) -> int | None:
    try:
        if (folder / "cpu.max").exists():
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        if quota == "max" or int(quota) <= 0 or int(period) <= 0:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def _memory(folder: Path) -> int | None:
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            text = (folder / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 1 << 60:  # v1 writes "no limit" as ~2**63
            return int(text)
        return None
    return None


def usable_cores() -> int:
    """How many cores this process can keep busy: its affinity set, capped by the container's
    CPU limit."""
    cores = len(allowed_cores())
    quota = cpu_quota()
    return max(1, min(cores, quota) if quota else cores)


def cores_per_rank() -> int:
    """Usable cores per training process on this machine: shared by torchrun's local ranks
    (LOCAL_WORLD_SIZE), at least one."""
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    except ValueError:
        ranks = 1
    return max(1, usable_cores() // ranks)
