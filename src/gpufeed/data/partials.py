"""Partial files named after their writer (PID, host and PID namespace), so that a later process
removes those a killed writer left (SIGKILL, out of memory) and never a live writer's: the
cache's shards being written (`Source`'s `cache_dir`) and the local shards that `pack` builds
for a remote destination in the temporary folder ($TMPDIR)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import tempfile
import time
from pathlib import Path

from gpufeed.processes import alive

STALE_PARTIAL_S = 24 * 3600  # a partial cache file untouched this long has no live writer
_PARTIAL = re.compile(r"\.tmp-(\d+)@(.+)-[^-]*$")  # PID@HOST of its writer (see partial_prefix)
PACK_TMP = "gpufeed-pack-"


def partial_prefix(name: str) -> str:
    """The name prefix of cache file `name` while it is written: its writer's PID and host, so
    a later run can tell a killed writer's partial file from a live one's."""
    return f"{name}.tmp-{os.getpid()}@{writer_host()}-"


def writer_host() -> str:
    """This host and PID namespace: containers that share a host name (--uts=host) and a
    cache_dir but not their PIDs must not judge each other's writers by PID."""
    try:
        namespace = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}~{namespace}" if namespace else socket.gethostname()


def remove_partial_files(folder: Path) -> None:
    """Delete the partial cache files in `folder` that no live writer owns: those of a process
    of this host and PID namespace that is gone (killed mid-shard: SIGKILL, out of memory), and
    any untouched for `STALE_PARTIAL_S` (another host's, or an older gpufeed's). Only a writer's
    own `close` removed them, so each crash left up to a shard per worker behind. Safe beside
    live writers in other processes."""
    host, now = writer_host(), time.time()
    try:
        entries = [e for e in os.scandir(folder) if ".tmp-" in e.name]
    except OSError:
        return
    for e in entries:
        m = _PARTIAL.search(e.name)
        with contextlib.suppress(OSError):
            gone = m is not None and m[2] == host and not alive(int(m[1]))
            if gone or now - e.stat(follow_symlinks=False).st_mtime > STALE_PARTIAL_S:
                os.unlink(e.path)


def _tag(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:n]


def pack_tmp(url: str, name: str) -> str:
    """A new empty file in the temporary folder to build `name` of the pack to remote `url` in:
    `gpufeed-pack-DST-PID@HOST-RANDOM-NAME` (DST and HOST hashed: a host name may hold '-')."""
    prefix = f"{PACK_TMP}{_tag(url, 12)}-{os.getpid()}@{_tag(writer_host(), 8)}-"
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=f"-{name}")
    os.close(fd)
    return path


def remove_stale_pack_tmp(url: str, own: re.Pattern[str]) -> int:
    """Delete the files `pack_tmp` made for the pack to `url` whose writer (a process of this
    host and PID namespace) is gone, for names `own` matches; never a live pack's, nor another
    destination's. Returns how many."""
    mine = re.compile(
        rf"{PACK_TMP}{_tag(url, 12)}-(\d+)@{_tag(writer_host(), 8)}-[a-z0-9_]+-(?:{own.pattern})"
    )
    removed = 0
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return 0
    for e in entries:
        m = mine.fullmatch(e.name)
        if m is not None and not alive(int(m[1])):
            with contextlib.suppress(FileNotFoundError):  # another resumed pack's sweep
                os.unlink(e.path)
                removed += 1
    return removed
