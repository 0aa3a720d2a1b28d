"""Whether a process of this host still runs: one answer for every check of a writer or a
training process that may have been killed."""

from __future__ import annotations

import os

__all__ = ["alive"]


def alive(pid: int) -> bool:
    """Whether process `pid` runs on this host: a zombie (exited, not yet reaped) does not;
    another user's process does."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):  # gone, or no such pid number
        return False
    except OSError:  # another user's
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True
