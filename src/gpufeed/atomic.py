"""Atomic file writes: a reader (a browser, CI, a training job resuming) never sees half a file."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def write_atomic(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    tmp: str | os.PathLike[str] | None = None,
    make_parents: bool = False,
    fsync: bool = False,
) -> None:
    """Write `data` (text as UTF-8) to a temporary name next to `path` (default `.NAME.PID.tmp`),
    then rename it over `path`. Raises OSError if it cannot; the temporary file is never left behind.
    A symlink is written through (its target replaced, the link kept); a path that is not a
    regular file (`/dev/stdout`, a FIFO, a device) is written into, never replaced.
    """
    path = Path(os.path.realpath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # not there yet
        special = False
    if special:
        with open(path, "wb") as f:
            f.write(payload)
        return
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tmp) if tmp is not None else path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
