"""A pack to S3 builds each shard in $TMPDIR: one killed (SIGKILL, out of memory) left its
partial shard there, and the resumed pack never removed it. Now a pack removes the temporary
shards of its destination whose writer is dead, and nothing else (a live pack's, files it
cannot attribute)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from processes import wait_until

from gpufeed.data.source import Destination, Source, filesystem

HELD = "shard-00002.tar"  # its upload is held until the pack has been killed


def _hold_upload(proxy: Any) -> tuple[threading.Event, threading.Event]:
    """Make `proxy` hold the first PUT of HELD (the pack waits in its upload, the shard built
    in $TMPDIR) until `release` is set, then fail it; (reached, release)."""
    reached, release = threading.Event(), threading.Event()
    proxy.every = 10**9  # no other faults

    def fault(method: str, path: str) -> str | None:
        if method == "PUT" and path.split("?")[0].endswith(f"/{HELD}") and not reached.is_set():
            reached.set()
            release.wait(120)
            return "500"
        return None

    proxy._fault = fault
    return reached, release


def test_a_resumed_pack_removes_the_partial_shard_a_killed_pack_left_in_tmpdir(
    id_list: Path, s3_env: str, faulty_proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    bucket = f"bucket-{uuid.uuid4().hex[:12]}"
    filesystem("s3://x").mkdir(bucket)
    url = f"s3://{bucket}/train"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # a live pack's temporary shard (this process's) for the same destination, and a file no
    # pack can be told to own (the old name): both are kept
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    live = Path(Destination(url).local_tmp("shard-00005.tar"))
    foreign = tmp / "gpufeed-pack-k3j2h1g0-shard-00001.tar"
    foreign.write_bytes(b"an older gpufeed's")
    kept = {live.name, foreign.name}

    reached, release = _hold_upload(faulty_proxy)
    cmd = [sys.executable, "-m", "gpufeed", "pack", str(id_list), url]
    cmd += ["--shard-size", "16KB", "--workers", "1"]
    env = {**os.environ, "TMPDIR": str(tmp), "AWS_ENDPOINT_URL": faulty_proxy.url}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: reached.is_set() or proc.poll() is not None, timeout=120)
        assert reached.is_set(), proc.communicate()
        partial = {p.name for p in tmp.iterdir()} - kept
        assert len(partial) == 1 and next(iter(partial)).endswith(f"-{HELD}"), partial
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert {p.name for p in tmp.iterdir()} == kept | partial  # the killed pack's is left

    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after 2 finished shards" in resumed.stdout
    assert {p.name for p in tmp.iterdir()} == kept
    assert live.read_bytes() == b"" and foreign.read_bytes() == b"an older gpufeed's"
    assert Source(url).read_index().total == 48
