"""A loader worker that makes no progress (SIGSTOP) is named within `worker_timeout`, never waited
for without end; an idle worker while the loop is busy elsewhere is not stuck."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpufeed.data import Loader
from gpufeed.data.augment import Augment

OUTER_S = 120  # the test's own bound: far above every deadline here, on a busy machine

# The training loop, in a process of its own so that a loader that waits without end fails the
# test instead of hanging it: takes 4 batches, stops worker 1, then iterates epochs until an
# error, which it prints as JSON with the seconds waited since the stop.
CHILD = r"""
import json, os, signal, sys, time
shards, options, pid_file = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
floor = options.pop("auto_floor", None)
if floor is not None:
    import gpufeed.data.watchdog as watchdog
    watchdog.AUTO_FLOOR_S = floor
from gpufeed.data import Loader
from gpufeed.data.augment import Augment
from gpufeed.data.workers import LoaderWorkerError

loader = Loader(shards, 2, num_workers=2, device="cpu", augment=Augment(size=(16, 16)), **options)
it = iter(loader)
for _ in range(4):
    next(it)
victim = loader._pool.processes[1].pid
with open(pid_file, "w") as f:
    f.write(str(victim))
os.kill(victim, signal.SIGSTOP)
stopped = time.monotonic()
report = {"victim": victim}
try:
    for _ in range(1000):
        for _batch in it:
            pass
        it = iter(loader)
except Exception as e:
    report.update(
        error=type(e).__name__,
        worker_error=isinstance(e, LoaderWorkerError),
        message=str(e),
        waited=time.monotonic() - stopped,
    )
loader.close()  # with the worker still stopped: close ends it all the same
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        if __import__("psutil").Process(victim).status() == "zombie":
            break
    except Exception:
        break
    time.sleep(0.1)
else:
    report["left_running"] = True
print(json.dumps(report), flush=True)
"""


def _stop_a_worker(shards: Path, tmp_path: Path, **options: Any) -> dict[str, Any]:
    """Run CHILD with these Loader options; its report. The stopped worker is ended after."""
    pid_file = tmp_path / "victim.pid"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(shards), json.dumps(options), str(pid_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=OUTER_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no error within {OUTER_S} s of stopping a worker: the loop waits on\n{err}")
    finally:
        _end(pid_file)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _end(pid_file: Path) -> None:
    """Kill the worker the test stopped, if it is still there, stopped (the loop timed out)."""
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    try:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, psutil.NoSuchProcess):
        pass


def test_a_stopped_worker_is_named_with_its_pid_state_batch_and_the_option(
    shards: Path, tmp_path: Path
):
    report = _stop_a_worker(shards, tmp_path, worker_timeout=5)
    assert report.get("worker_error"), report
    victim, message = report["victim"], report["message"]
    assert f"loader worker 1 (pid {victim}, process state: stopped) made no progress" in message
    assert report["waited"] >= 5  # not before the deadline
    assert " key " in message and "shard " in message and "batch " in message
    assert f"kill -CONT {victim}" in message
    assert "worker_timeout=5 set this deadline" in message
    assert "set Loader(worker_timeout=SECONDS) above 5 to wait longer" in message
    assert "left_running" not in report  # close() ends a stopped worker too


def test_the_automatic_deadline_comes_from_the_slowest_batch(shards: Path, tmp_path: Path):
    # the floor lowered from 120 s, so that the test does not wait for it
    report = _stop_a_worker(shards, tmp_path, auto_floor=3.0)
    assert report.get("worker_error"), report
    message = report["message"]
    assert f"loader worker 1 (pid {report['victim']}" in message
    assert "The automatic worker_timeout (10× the slowest batch so far" in message
    assert "at least 3 s) set this deadline" in message
    assert report["waited"] >= 3


def test_a_worker_idle_while_the_loop_is_busy_elsewhere_is_not_stuck(shards: Path):
    timeout = 3.0
    with Loader(
        shards,
        2,
        num_workers=2,
        device="cpu",
        augment=Augment(size=(16, 16)),
        worker_timeout=timeout,
    ) as loader:
        got = 0
        for i, (_, labels) in enumerate(loader):
            if i == 1:
                time.sleep(2 * timeout)  # an evaluation: the workers fill their slots and wait
            got += len(labels)
        assert got == 48
        assert sum(len(labels) for _, labels in loader) == 48  # and the next epoch


def test_worker_timeout_zero_waits_without_end_and_none_is_automatic(shards: Path):
    with Loader(shards, 8, num_workers=1, device="cpu", worker_timeout=0) as off:
        assert off.worker_timeout == 0
        assert sum(len(y) for _, y in off) == 48
    with Loader(shards, 8, num_workers=1, device="cpu") as auto:
        assert auto.worker_timeout is None


@pytest.mark.slow
def test_a_stopped_ray_actor_is_named_with_its_pid_host_and_the_option(shards: Path):
    from gpufeed.bench.raycluster import LocalCluster, use_loopback
    from gpufeed.data.workers import LoaderWorkerError

    use_loopback()  # before Ray is imported
    ray = pytest.importorskip("ray")
    with LocalCluster(head_cpus=0) as cluster:
        cluster.connect()
        cluster.add_node(cpus=1)
        loader = Loader(
            shards,
            2,
            num_workers=1,
            cluster=cluster.address,
            device="cpu",
            augment=Augment(size=(16, 16)),
            worker_timeout=5,
        )
        victim = 0
        try:
            it = iter(loader)
            for _ in range(4):
                next(it)
            [(victim, host)] = loader._pool._where.values()  # type: ignore[union-attr]
            os.kill(victim, signal.SIGSTOP)
            stopped = time.monotonic()
            with pytest.raises(LoaderWorkerError) as raised:
                for _ in range(1000):  # the batches asked before the stop come first
                    for _batch in it:
                        pass
                    it = iter(loader)
            assert time.monotonic() - stopped >= 5
            message = str(raised.value)
            assert f"Ray loader actor of worker 0 (pid {victim} on {host}" in message
            assert "process state: stopped" in message and f"kill -CONT {victim}" in message
            assert "worker_timeout=5 set this deadline" in message
        finally:
            if victim:
                os.kill(victim, signal.SIGCONT)
            loader.close()
            ray.shutdown()
