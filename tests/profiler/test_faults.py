"""Faults the profiler must absorb: odd user objects and failing hooks never reach the training,
and storage faults (read-only or full disk, an --out that cannot be created) never change what the
command does nor its exit code. Every test runs the real `gpufeed profile -- python script.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpufeed


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gpufeed: warning")]


def _leftover_temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# --- 1. the hooks never raise into the user's code ----------------------------------------------

# A DataLoader yields the user's own batch objects (no collation); an optimizer steps after each.
ODD_BATCH = """
import sys, torch
from torch.utils.data import DataLoader, Dataset

class ShapeMethod:
    def shape(self):
        return (4, 2)

class ShapeRaises:
    @property
    def shape(self):
        raise RuntimeError("no shape for you")

class ShapeInt:
    shape = 5

class ShapeEmptyDim:
    shape = (None, 3)

Batch = {"method": ShapeMethod, "raises": ShapeRaises, "int": ShapeInt, "none-dim": ShapeEmptyDim}[
    sys.argv[1]
]

class Data(Dataset):
    def __len__(self):
        return 6
    def __getitem__(self, i):
        return [Batch(), {"x": Batch()}]

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in DataLoader(Data(), batch_size=None):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
print("done", flush=True)
"""


@pytest.mark.parametrize("kind", ["method", "raises", "int", "none-dim"])
def test_a_batch_with_an_odd_shape_trains_as_it_does_unprofiled(run_profiled, kind):
    cp, run_dir = run_profiled(ODD_BATCH, kind)
    assert cp.returncode == 0, cp.stderr
    assert "done" in cp.stdout and "Traceback" not in cp.stderr
    assert _warnings(cp.stderr) == []  # not the user's error: the batch size is just unknown
    steps = gpufeed.load(run_dir).steps
    assert len(steps) == 6 and (steps["samples"] == 2).all()  # read from the model's input instead


# Every hook meets a recorder that raises on any use: the optimizer post-step hook, DataLoader
# `__next__` (batches and the StopIteration that ends the epoch), `autocast.__enter__`,
# `gpufeed.step()` and the exit handler.
BROKEN_RECORDER = """
import torch, gpufeed
from gpufeed.profiler import autopatch

class Broken:
    def __bool__(self):
        return True
    def __getattr__(self, name):
        raise RuntimeError("broken recorder: " + name)
    def __setattr__(self, name, value):
        raise RuntimeError("broken recorder: set " + name)

autopatch._recorder = Broken()
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,)))
for epoch in range(2):
    for x, y in torch.utils.data.DataLoader(data, batch_size=4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        gpufeed.step(samples=4)
print("done", flush=True)
"""


def test_hooks_that_fail_are_dropped_and_warned_once_never_raised(run_profiled):
    cp, _ = run_profiled(BROKEN_RECORDER)
    assert cp.returncode == 0, cp.stderr
    assert "done" in cp.stdout and "Traceback" not in cp.stderr
    warnings = _warnings(cp.stderr)
    assert len(warnings) == 1 and "profiler hook failed" in warnings[0], cp.stderr


# Only batch handling fails: the steps the optimizer marks are still recorded, the failed batch
# events are counted as dropped.
FAILING_BATCH_HOOK = """
import torch
from gpufeed.profiler.steps import Recorder

def on_batch(self, *args):
    raise ValueError("cannot handle this batch")

Recorder.on_batch = on_batch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(20, 4), torch.randint(0, 2, (20,)))
for x, y in torch.utils.data.DataLoader(data, batch_size=4):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
print("done", flush=True)
"""


def test_a_failing_hook_drops_its_events_and_steps_are_still_recorded(run_profiled):
    cp, run_dir = run_profiled(FAILING_BATCH_HOOK)
    assert cp.returncode == 0, cp.stderr
    assert "done" in cp.stdout and "Traceback" not in cp.stderr
    assert len(_warnings(cp.stderr)) == 1
    run = gpufeed.load(run_dir)
    assert len(run.steps) == 5
    assert run.meta["dropped_events"] == 5  # one per batch
    assert run.meta["finished"] and run.meta["exit_code"] == 0


# --- 2. storage faults never change the command nor its exit code -------------------------------

# Runs a shell command's worth of locking in Python: "chmod" for a normal user; root ignores
# permissions, so it uses the immutable attribute (chattr +i), which stops even writes through
# files already open (the SQLite stores). A -shm file is memory-mapped and left alone.
LOCK = """
import os, subprocess

def lock(d, how):
    names = [os.path.join(d, n) for n in os.listdir(d) if not n.endswith("-shm")]
    if how == "chmod":
        for n in names:
            os.chmod(n, 0o444)
        os.chmod(d, 0o555)
    else:
        subprocess.run(["chattr", "+i", *names, d], check=True, capture_output=True)

def unlock(d, how):
    if how == "chmod":
        os.chmod(d, 0o755)
        for n in os.listdir(d):
            os.chmod(os.path.join(d, n), 0o644)
    else:
        names = [os.path.join(d, n) for n in os.listdir(d)]
        subprocess.run(["chattr", "-i", *names, d], check=True, capture_output=True)
"""
_lock_ns: dict = {}
exec(LOCK, _lock_ns)
lock, unlock = _lock_ns["lock"], _lock_ns["unlock"]


@pytest.fixture
def lock_how(tmp_path) -> str:
    """How this machine can make a directory unwritable mid-run; skips where nothing works."""
    how = "chmod" if os.geteuid() != 0 else "chattr"
    if how == "chattr" and shutil.which("chattr") is None:
        pytest.skip("running as root, where chmod does not stop writes, and chattr is missing")
    probe = tmp_path / "lock-probe"
    probe.mkdir()
    (probe / "f").write_text("")
    with open(probe / "f", "a") as already_open:
        try:
            lock(str(probe), how)
        except (OSError, subprocess.CalledProcessError) as e:
            pytest.skip(f"cannot make a directory read-only here with {how}: {e}")
        blocked = 0
        try:
            try:
                (probe / "g").write_text("x")
            except OSError:
                blocked += 1
            if how == "chattr":  # root: writes through a file already open must fail too
                try:
                    already_open.write("x")
                    already_open.flush()
                except OSError:
                    blocked += 1
        finally:
            unlock(str(probe), how)
    if blocked != (2 if how == "chattr" else 1):
        pytest.skip(f"{how} does not stop writes on this file system")
    return how


# Trains a few steps, then waits until the recorder has flushed some (shared by the scripts below).
TRAIN_UNTIL_FLUSHED = """
import glob, sys, time, torch
from gpufeed.profiler.store import read_store

run_dir = os.environ["GPUFEED_RUN_DIR"]
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)

def train(n):
    for _ in range(n):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.02)

train(10)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # until the recorder has flushed some steps
    stores = glob.glob(os.path.join(run_dir, "steps-*.db"))
    try:
        if stores and len(read_store(stores[0])["steps"]) >= 5:
            break
    except Exception:
        pass
    time.sleep(0.05)
"""

# Trains, locks its own run directory after a few recorded steps, trains on, exits 3.
LOCKS_ITSELF = (
    LOCK
    + TRAIN_UNTIL_FLUSHED
    + """lock(run_dir, sys.argv[1])
print("LOCKED", flush=True)
train(60)  # > 1 s: several flushes of the recorder and the sampler fail
print("done", flush=True)
sys.exit(3)
"""
)


def test_run_dir_made_read_only_mid_run_keeps_the_exit_code_and_warns_once(run_profiled, lock_how):
    cp, run_dir = run_profiled(LOCKS_ITSELF, lock_how)
    try:
        assert cp.returncode == 3, cp.stderr
        assert "LOCKED" in cp.stdout and "done" in cp.stdout
        assert "Traceback" not in cp.stderr, cp.stderr
        # At most one line per process: the training process and the `gpufeed profile` parent.
        warnings = _warnings(cp.stderr)
        assert 1 <= len(warnings) <= 2, cp.stderr
        assert sum("profile store" in w for w in warnings) <= 1
        assert _leftover_temp_files(run_dir) == []
    finally:
        unlock(str(run_dir), lock_how)
    run = gpufeed.load(run_dir)
    assert run.meta["exit_code"] is None  # the final meta.json really could not be written
    assert len(run.steps) >= 5
    if lock_how == "chattr":
        assert len(run.steps) < 70  # and neither could the later steps


def test_out_under_a_regular_file_still_runs_the_command_with_its_exit_code(tmp_path, gpufeed_cli):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w'); raise SystemExit(3)"
    cmd = gpufeed_cli("profile", "--out", str(blocker / "runs"), "--", sys.executable, "-c", code)
    cp = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert cp.returncode == 3, cp.stderr
    assert marker.exists()
    warnings = _warnings(cp.stderr)
    assert len(warnings) == 1, cp.stderr
    assert "cannot write the run directory" in warnings[0] and str(blocker) in warnings[0]
    assert "without profiling" in warnings[0]
    assert "Traceback" not in cp.stderr


def test_read_only_out_dir_still_runs_the_command(tmp_path, gpufeed_cli, lock_how):
    ro = tmp_path / "ro"
    ro.mkdir()
    lock(str(ro), lock_how)
    try:
        code = "print('ran'); raise SystemExit(3)"
        cmd = gpufeed_cli("profile", "--out", str(ro), "--", sys.executable, "-c", code)
        cp = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    finally:
        unlock(str(ro), lock_how)
    assert cp.returncode == 3 and "ran" in cp.stdout, cp.stderr
    warnings = _warnings(cp.stderr)
    assert len(warnings) == 1 and "cannot write the run directory" in warnings[0], cp.stderr
    assert list(ro.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A 4 MiB tmpfs mounted in tmp_path (root only), unmounted afterwards."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    cp = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "gpufeed-test", str(mnt)],
        capture_output=True,
        text=True,
    )
    if cp.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {cp.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


FILL = """
import errno

def fill(d):
    with open(os.path.join(d, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(65536))
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    try:  # the last partial page too
        with open(os.path.join(d, "filler2"), "wb", buffering=0) as f:
            while True:
                f.write(b"x")
    except OSError:
        pass
"""

FILLS_THE_DISK = (
    "import os\n"
    + FILL
    + TRAIN_UNTIL_FLUSHED
    + """fill(os.path.dirname(run_dir))
print("FULL", flush=True)
train(60)
print("done", flush=True)
sys.exit(3)
"""
)


def test_disk_full_mid_run_keeps_the_exit_code_warns_once_and_leaves_no_temp_file(
    run_profiled, small_disk
):
    cp, run_dir = run_profiled(FILLS_THE_DISK, out=small_disk)
    assert cp.returncode == 3, cp.stderr
    assert "FULL" in cp.stdout and "done" in cp.stdout
    assert "Traceback" not in cp.stderr, cp.stderr
    warnings = _warnings(cp.stderr)
    assert 1 <= len(warnings) <= 2, cp.stderr
    assert _leftover_temp_files(small_disk) == []
    for filler in small_disk.glob("filler*"):
        filler.unlink()
    run = gpufeed.load(run_dir)
    assert len(run.steps) >= 5
    assert run.meta["exit_code"] is None  # the final meta.json really could not be written


def test_disk_full_before_the_start_still_runs_the_command(small_disk, tmp_path, gpufeed_cli):
    ns: dict = {"os": os}
    exec(FILL, ns)
    ns["fill"](str(small_disk))
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, torch
            model = torch.nn.Linear(8, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(20):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
            print("ran", flush=True)
            sys.exit(3)
            """
        )
    )
    cmd = gpufeed_cli("profile", "--out", str(small_disk / "runs"), "--", sys.executable)
    cp = subprocess.run(
        [*cmd, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert cp.returncode == 3, cp.stderr
    assert "ran" in cp.stdout
    assert "Traceback" not in cp.stderr, cp.stderr
    assert 1 <= len(_warnings(cp.stderr)) <= 2, cp.stderr
    assert _leftover_temp_files(small_disk) == []


# --- CUDA events that fail (no GPU needed: a stand-in torch.cuda, in process) -------------------


class _FailingEvent:
    def __init__(self, fail_record: bool) -> None:
        self._fail_record = fail_record

    def record(self) -> None:
        if self._fail_record:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def query(self) -> bool:
        raise RuntimeError("CUDA error: query failed")

    def elapsed_time(self, other: object) -> float:
        raise RuntimeError("CUDA error: elapsed_time failed")


class _FakeCuda:
    """torch.cuda whose events fail: at creation, at record(), or only when polled."""

    def __init__(self, fail: str) -> None:
        self.fail = fail

    def Event(self, enable_timing: bool = False) -> _FailingEvent:
        if self.fail == "create":
            raise RuntimeError("CUDA error: out of memory")
        return _FailingEvent(fail_record=self.fail == "record")


@pytest.mark.parametrize("fail", ["create", "record", "poll"])
def test_failing_cuda_events_never_raise_and_steps_are_still_recorded(
    tmp_path, monkeypatch, capsys, fail
):
    from gpufeed.profiler import session
    from gpufeed.profiler.steps import Recorder
    from gpufeed.profiler.store import read_store

    monkeypatch.setattr(session, "_warned", set())
    rec = Recorder(tmp_path / "s.db", {"host": "h"}, flush_interval=60)
    rec._cuda = _FakeCuda(fail)  # as if torch.cuda were initialized
    opt = _FakeCuda("")  # any object the hook can weakly refer to stands in for the optimizer
    try:
        for _ in range(5):
            rec.on_batch(0.0, 0.001, None)
            rec.on_optimizer_step(opt)
    finally:
        rec.close(gpu_wait=0.1)
    steps = read_store(tmp_path / "s.db")["steps"]
    assert [s[0] for s in steps] == list(range(5))
    assert all(s[5] is None for s in steps)  # no GPU time is invented
    err = capsys.readouterr().err
    if fail == "poll":  # polling failures only leave gpu_time empty, silently, as before
        assert "warning" not in err
    else:
        assert err.count("gpufeed: warning: CUDA event timing failed") == 1


def test_torch_cuda_that_raises_when_asked_never_raises_into_training(
    tmp_path, monkeypatch, capsys
):
    from gpufeed.profiler import session
    from gpufeed.profiler.steps import Recorder

    class Cuda:
        def is_initialized(self) -> bool:
            raise RuntimeError("CUDA driver initialization failed")

    class Torch:
        cuda = Cuda()

    monkeypatch.setattr(session, "_warned", set())
    monkeypatch.setitem(sys.modules, "torch", Torch())
    rec = Recorder(tmp_path / "s.db", {"host": "h"}, flush_interval=60)
    try:
        for _ in range(3):
            rec.on_batch(0.0, 0.001, None)
            rec.end_step(None)
    finally:
        monkeypatch.undo()
        rec.close(gpu_wait=0.1)
    assert capsys.readouterr().err.count("CUDA event timing failed") == 1
