"""Where `pack` and `index` write: a local folder or a remote prefix, one whole file at a time."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gpufeed.atomic import write_atomic
from gpufeed.data.location import base_url, is_remote
from gpufeed.data.partials import pack_tmp, remove_stale_pack_tmp
from gpufeed.data.shards import ShardError
from gpufeed.data.storage import (
    DEFAULT_TIMEOUT,
    call_remote,
    check_storage_options,
    filesystem,
    hearing,
    remote_timeout,
)
from gpufeed.data.storage_errors import remote_error, retrying


class Destination:
    """Where `pack` writes: atomic whole-file writes to a local directory or a remote prefix.
    Remote operations have the same deadline, retries and clear errors (ShardError) as `Source`."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        self.url = base_url(url)
        self.remote = is_remote(self.url)
        self.storage_options = check_storage_options(storage_options)
        self.timeout = remote_timeout(storage_options) if self.remote else DEFAULT_TIMEOUT
        self._reached = False
        if not self.remote:
            try:
                Path(self.url).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                what = "it is a file" if isinstance(e, FileExistsError) else e.strerror or str(e)
                raise ShardError(
                    f"cannot write to {self.url}: {what}; give a writable folder (created if "
                    "missing) or s3://bucket/prefix"
                ) from None

    def path(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _fs(self) -> Any:
        return filesystem(self.url, self.storage_options)

    def _remote(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """`fs.method(*args, **kwargs)` with retries within the deadline; failures are one
        ShardError."""
        fs = self._fs()
        with hearing(lambda: None) as heard:
            out, self._reached, expired = retrying(
                lambda timeout: call_remote(fs, method, *args, timeout=timeout, **kwargs),
                retries=4,
                backoff=0.1,
                deadline=self.timeout,
                reached=self._reached,
                on_retry=lambda: None,
            )
        if isinstance(out, BaseException):
            named = args and str(args[0]).startswith(f"{self.url}/")  # a file, not the bucket
            where = str(args[0]) if named else self.url
            raise remote_error(what, where, fs, out, self.timeout, expired, heard.answer) from out
        return out

    def check(self) -> None:
        """Fail early, with a clear ShardError, when a remote destination cannot be written
        (missing bucket, no credentials, unreachable endpoint); nothing is written."""
        if self.remote:
            bucket = self.url.split("://", 1)[1].split("/", 1)[0]
            self._remote("write to", "ls", bucket)

    def exists(self, name: str) -> bool:
        if self.remote:
            return bool(self._remote("write to", "exists", self.path(name)))
        return Path(self.path(name)).exists()

    def read_bytes(self, name: str) -> bytes:
        if self.remote:
            return self._remote("read", "cat_file", self.path(name))  # type: ignore[no-any-return]
        return Path(self.path(name)).read_bytes()

    def size(self, name: str) -> int:
        if self.remote:
            return int(self._remote("read", "info", self.path(name))["size"])
        return os.path.getsize(self.path(name))

    def sizes(self) -> dict[str, int]:
        """{name: bytes} of the files directly in the destination (one listing, also remote)."""
        if self.remote:
            listed = self._remote("read", "ls", self.url, detail=True, refresh=True)
            return {
                str(f["name"]).rstrip("/").rsplit("/", 1)[-1]: int(f.get("size") or 0)
                for f in listed
                if f.get("type") == "file"
            }
        with os.scandir(self.url) as entries:
            return {e.name: e.stat().st_size for e in entries if e.is_file()}

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write atomically: a temporary name then a rename (an S3 PUT is atomic by itself)."""
        if self.remote:
            self._remote("write to", "pipe_file", self.path(name), data)
            return
        write_atomic(self.path(name), data, tmp=self.local_tmp(name), fsync=True)

    def put_file(self, local: str, name: str) -> None:
        """Move a finished local file into place atomically (the local file is gone after,
        also when the upload failed)."""
        if self.remote:
            try:
                self._remote("write to", "put_file", local, self.path(name))
            finally:
                os.unlink(local)
        else:
            os.replace(local, self.path(name))

    def remove(self, name: str) -> None:
        """Delete `name` if it is there."""
        if not self.remote:
            Path(self.path(name)).unlink(missing_ok=True)
        elif self.exists(name):
            self._remote("write to", "rm_file", self.path(name))

    def local_tmp(self, name: str) -> str:
        """A temporary local path for building `name` (inside DST when it is local, so the rename is atomic)."""
        if self.remote:  # named after this process and DST: see `remove_stale_tmp`
            return pack_tmp(self.url, name)
        return f"{self.path(name)}.tmp-{os.getpid()}"

    def remove_stale_tmp(self, own: re.Pattern[str]) -> int:
        """Delete the temporary files (`local_tmp`) of the files `own` names that a previous,
        interrupted writer left behind; never another file (a user's `results.tmp-2024`), nor,
        for a remote DST (files in $TMPDIR), those of a live pack. Returns how many."""
        if self.remote:
            return remove_stale_pack_tmp(self.url, own)
        tmp = re.compile(rf"(?:{own.pattern})\.tmp-\d+")
        stale = [p for p in Path(self.url).glob("*.tmp-*") if tmp.fullmatch(p.name)]
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)
