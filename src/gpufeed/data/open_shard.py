"""A shard being packed: written under a temporary name, then put in place whole, and never left
behind by a failed or stopped pack (SIGTERM ends a pack as Ctrl-C does; a signal that comes while
the temporary file is created waits until it is held)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

from gpufeed.data.destination import Destination
from gpufeed.data.index_file import ShardEntry
from gpufeed.data.shards import ShardWriter, sha256_file, shard_name


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Within: SIGTERM (`kill`, a batch scheduler's stop) raises SystemExit(143), as Ctrl-C
    raises KeyboardInterrupt, so the pack removes its temporary shard on the way out (for an
    s3:// DST a file of up to a shard's size in the temporary folder, which nothing else
    removes). Only in the main thread, and only where SIGTERM has its default action (a
    program's own handler is kept); a second SIGTERM ends the process at once."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Within: Ctrl-C and SIGTERM wait until the block ends, then act as they would have. A
    signal's handler runs between any two bytecodes, so one that came between creating a
    temporary file and holding it in a variable would leave the file where no clean-up finds
    it. Only in the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        held.append(signum)

    kept = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(s)
        if callable(handler):  # not SIG_DFL / SIG_IGN, nor one set outside Python (None)
            kept[s] = signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(held):
            kept[s](s, None)  # raises KeyboardInterrupt or SystemExit: the caller cleans up


class OpenShard:
    """A shard being written under a temporary name."""

    def __init__(self, out: Destination, number: int) -> None:
        self.out, self.name = out, shard_name(number)
        self.tmp = out.local_tmp(self.name)
        self.file = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish()
        self.writer = ShardWriter(self.file, self.name)

    def discard(self) -> None:
        """Close and delete the unfinished shard."""
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)

    def finish(self) -> ShardEntry:
        """Close the shard, record its size and SHA-256, and put it in place under its name."""
        entry = self.writer.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        entry.bytes = os.path.getsize(self.tmp)
        entry.sha256 = sha256_file(self.tmp)
        self.out.put_file(self.tmp, self.name)  # the temporary file is gone after, also on error
        return entry
