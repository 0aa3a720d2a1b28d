"""The CPU cores this process may use: one count for every sizing decision (loader workers,
model threads, the profiler's advice), so that a job pinned to 16 cores of a 64-core host (Slurm,
a Docker cpuset) or limited to 16 CPUs by its container (a Kubernetes CPU limit) is advised for
16 cores, not 64."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["allowed_cores", "cpu_quota", "usable_cores"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity set; every core where that is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_quota(root: Path | None = None) -> int | None:
    """The container's CPU limit in whole cores, rounded up (cgroup v2 `cpu.max`, else v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`); None where there is none or it cannot be read.
    Reads the cgroup root, which inside a container is the container's own cgroup."""
    root = root or CGROUP_ROOT
    try:
        if (root / "cpu.max").exists():
            quota, period = (root / "cpu.max").read_text().split()[:2]
        else:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        if quota == "max" or int(quota) <= 0 or int(period) <= 0:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """How many cores this process can keep busy: its affinity set, capped by the container's
    CPU limit."""
    cores = len(allowed_cores())
    quota = cpu_quota()
    return max(1, min(cores, quota) if quota else cores)
