"""Atomic file writes: a reader (a browser, CI, a training job resuming) never sees half a file."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from pathlib import Path

_FD_PATH = re.compile(r"/dev/(?:std(?P<std>in|out|err)|fd/(?P<fd>\d+))|/proc/self/fd/(?P<proc>\d+)")


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
    regular file (a FIFO, a device) is written into, never replaced; `/dev/stdout`, `/dev/stderr`
    and `/dev/fd/N` are written into the file this process has open there, at its offset (a
    shell's `>>` appends, `>` keeps what was printed before).
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd = descriptor(path)
    if fd is not None:  # /dev/stdout & co: into the open file, at its offset (`>>` appends)
        with contextlib.suppress(Exception):  # what this process printed comes first
            (sys.stdout if fd == 1 else sys.stderr).flush()
        view = memoryview(payload)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:  # e.g. a pipe whose reader left: the error names the path given
            raise OSError(e.errno, e.strerror, os.fspath(path)) from None
        return
    try:  # before realpath: /dev/stdout on a pipe resolves to a name ("pipe:[N]") nothing can open
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # not there yet
        special = False
    if special:
        try:
            with open(path, "wb") as f:
                f.write(payload)
        except OSError as e:  # e.g. /dev/full: a write error names no file
            raise OSError(e.errno, e.strerror, os.fspath(path)) from None
        return
    given = os.fspath(path)
    path = Path(os.path.realpath(path))
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
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):  # named by the file asked for: not the temporary, nor none
            raise OSError(e.errno, e.strerror, given) from None
        raise


def descriptor(path: str | os.PathLike[str]) -> int | None:
    """The descriptor a path such as /dev/stdout or /dev/fd/3 names in this process, where it is
    open; None for any other path."""
    m = _FD_PATH.fullmatch(os.fspath(path))
    if m is None:
        return None
    fd = {"in": 0, "out": 1, "err": 2}[m["std"]] if m["std"] else int(m["fd"] or m["proc"])
    try:
        os.fstat(fd)
    except OSError:
        return None
    return fd
