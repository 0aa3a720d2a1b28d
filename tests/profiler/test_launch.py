"""`gpufeed profile -- CMD` end to end: real scripts, real DataLoader workers, real torchrun, kill -9."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import gpufeed
from gpufeed.profiler.store import read_store

REPO = Path(__file__).resolve().parents[2]

# A loader whose items sleep a known time; two batches per optimizer step (gradient accumulation).
# The script measures its own blocking time around next() and prints it per step.
SLOW_LOADER = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset

STEPS, BATCH, SLEEP, ACCUM = 8, 4, 0.01, 2

class Slow(Dataset):
    def __len__(self):
        return STEPS * ACCUM * BATCH
    def __getitem__(self, i):
        time.sleep(SLEEP)
        return torch.randn(16), i % 2

model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
it = iter(DataLoader(Slow(), batch_size=BATCH, num_workers=0))
for step in range(STEPS):
    waited = 0.0
    for _ in range(ACCUM):
        t0 = time.perf_counter()
        x, y = next(it)
        waited += time.perf_counter() - t0
        torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    print("WAIT", waited, flush=True)
"""


def test_steps_samples_and_data_wait_match_what_the_script_did(run_profiled):
    cp, run_dir = run_profiled(SLOW_LOADER)
    assert cp.returncode == 0, cp.stderr
    own = [float(line.split()[1]) for line in cp.stdout.splitlines() if line.startswith("WAIT")]
    run = gpufeed.load(run_dir)
    steps = run.steps
    assert len(own) == len(steps) == 8
    assert list(steps["step"]) == list(range(8))
    assert (steps["samples"] == 8).all()  # 2 batches of 4 per optimizer step
    # Each step waits for 8 items sleeping 10 ms: at least 80 ms, and what the script measured itself.
    assert (steps["data_wait"] >= 0.08).all()
    for ours, theirs in zip(steps["data_wait"], own, strict=True):
        assert ours == pytest.approx(theirs, abs=0.02)
    assert (steps["duration"] >= steps["data_wait"]).all()
    assert (steps["start"].iloc[1:].to_numpy() == steps["end"].iloc[:-1].to_numpy()).all()
    assert steps["gpu_time"].isna().all()  # CPU only: nothing is invented
    assert run.meta["finished"] and run.meta["exit_code"] == 0


def test_example_script_records_main_and_workers_and_no_gpu(run_profiled):
    # The sampler rescans the process tree once a second: a 5 ms sleep per sample keeps the two
    # workers alive for about 2 s, so they are seen however fast the machine is.
    cp, run_dir = run_profiled(
        REPO / "examples" / "train_small.py",
        "--steps",
        "25",
        "--workers",
        "2",
        "--batch-size",
        "32",
        "--sleep",
        "0.005",
    )
    assert cp.returncode == 0, cp.stderr
    run = gpufeed.load(run_dir)
    assert len(run.steps) == 25
    assert (run.steps["samples"] == 32).all()
    # Only the training process writes steps; its two DataLoader workers record nothing.
    assert len(list(run_dir.glob("steps-*.db"))) == 1
    main_pid = int(run.steps["pid"].iloc[0])
    roles = run.processes.groupby("role")["pid"].unique()
    assert set(roles["main"]) == {main_pid}
    assert len(roles["worker"]) == 2
    metrics = set(run.system["metric"])
    assert {"cpu.util", "cpu.core", "cpu.iowait", "mem.used", "disk.read", "net.rx"} <= metrics
    assert run.system[run.system["metric"] == "cpu.core"]["device"].nunique() == os.cpu_count()
    if not run.meta["gpus"]:
        assert not any(m.startswith("gpu.") for m in metrics)
        assert "NVML" in run.meta["gpu_unavailable"]
    meta = run.meta
    for key in (
        "command",
        "start_time",
        "end_time",
        "cpu_count",
        "cpu_model",
        "versions",
        "interval",
    ):
        assert meta[key], key
    assert meta["interval"] == 0.1
    assert meta["versions"]["torch"].startswith("2.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DDP = """
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(80, 8), torch.randint(0, 2, (80,)))
for x, y in DataLoader(data, batch_size=8):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
"""


def test_torchrun_records_every_rank_and_one_sampler(run_profiled):
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    launcher = [torchrun, "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    launcher += ["--master_port", str(_free_port())]
    cp, run_dir = run_profiled(DDP, launcher=launcher)
    assert cp.returncode == 0, cp.stderr
    run = gpufeed.load(run_dir)
    assert sorted(run.steps.groupby("rank").size().items()) == [(0, 10), (1, 10)]
    assert sorted(r["local_rank"] for r in run.meta["ranks"]) == [0, 1]
    assert {r["world_size"] for r in run.meta["ranks"]} == {2}
    # One sampler for the host; the torchrun launcher wrote no steps of its own.
    assert len(list(run_dir.glob("system-*.db"))) == 1
    assert len(list(run_dir.glob("steps-*.db"))) == 2
    mains = set(run.processes[run.processes["role"] == "main"]["pid"])
    assert mains == set(run.steps["pid"])
    assert len(run.processes[run.processes["role"] == "other"]["pid"].unique()) >= 1  # the launcher


# Trains "forever", printing each step's end time, until killed.
FOREVER = """
import time, torch
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 32)
i = 0
while True:
    model(x).sum().backward()
    opt.step()
    print("STEP", i, time.time(), flush=True)
    i += 1
    time.sleep(0.005)
"""


class _Reader:
    """Reads a pipe to its end in a thread, so the writer never blocks on a full pipe."""

    def __init__(self, stream) -> None:
        self._chunks: list[str] = []
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream) -> None:
        for line in stream:
            self._chunks.append(line)

    def text(self, timeout: float = 60) -> str:
        """Everything read, once the pipe has closed (or `timeout` passed)."""
        self._thread.join(timeout)
        return "".join(self._chunks)


def _start_forever(tmp_path: Path, gpufeed_cli) -> tuple[subprocess.Popen, Path, _Reader, _Reader]:
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    cmd = gpufeed_cli("profile", "--out", str(tmp_path / "runs"), "--interval", "0.1", "--")
    proc = subprocess.Popen(
        [*cmd, sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )
    # The script prints every step: a pipe nobody reads would fill and stop its training.
    out, err = _Reader(proc.stdout), _Reader(proc.stderr)
    # Wait for a condition, not for time (a busy machine may train slowly): until the store holds
    # enough steps. Those ended before they were seen; 1.5 s later they are all older than the
    # one-flush window the test allows to be lost, however slowly the rest goes.
    deadline = time.monotonic() + 180
    runs = tmp_path / "runs"
    while time.monotonic() < deadline and proc.poll() is None:
        stores = list(runs.glob("*/steps-*.db")) if runs.exists() else []
        if stores and _stored_steps(stores[0]) >= _STEPS_BEFORE_KILL:
            time.sleep(1.5)
            return proc, stores[0], out, err
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the training process too: it holds the pipes
    proc.wait(timeout=60)
    raise AssertionError(f"fewer than {_STEPS_BEFORE_KILL} steps were recorded: " + err.text())


_STEPS_BEFORE_KILL = 60


def _stored_steps(store: Path) -> int:
    try:
        return len(read_store(store)["steps"])
    except Exception:  # being created: no tables yet
        return 0


def _printed_steps(stdout: str) -> list[float]:
    # A kill may cut the last line short: only whole "STEP i time" lines count.
    fields = (line.split() for line in stdout.splitlines())
    return [float(f[2]) for f in fields if len(f) == 3 and f[0] == "STEP"]


@pytest.mark.parametrize("victim", ["training process", "whole tree"])
def test_kill_9_loses_at_most_the_last_flush(tmp_path, victim, gpufeed_cli):
    proc, store, out, err = _start_forever(tmp_path, gpufeed_cli)
    run_dir = store.parent
    live = gpufeed.load(run_dir)  # readable while it is being written
    assert len(live.steps) > 0 and not live.meta["finished"]
    killed_at = time.time()
    if victim == "whole tree":
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(int(store.stem.rsplit("-", 1)[1]), signal.SIGKILL)
    proc.wait(timeout=60)
    ends = _printed_steps(out.text())
    run = gpufeed.load(run_dir)
    recorded = len(run.steps)
    # The script prints a step after opt.step() returns: the step in progress at the kill may be
    # recorded without its line.
    assert recorded <= len(ends) + 1
    # Every step that ended more than one flush window (<= 1 s) before the kill is there.
    assert recorded >= sum(t <= killed_at - 1.0 for t in ends) > 50
    assert list(run.steps["step"]) == list(range(recorded))
    if victim == "whole tree":
        assert not run.meta["finished"] and "did not finish" in run.meta["not_finished"]
    else:
        assert proc.returncode == 128 + signal.SIGKILL, err.text()
        assert run.meta["finished"] and run.meta["exit_code"] == 137


def test_failing_command_passes_its_exit_code_and_the_run_is_written(run_profiled):
    cp, run_dir = run_profiled("import sys\nprint('partial work')\nsys.exit(7)\n")
    assert cp.returncode == 7
    assert "partial work" in cp.stdout
    meta = gpufeed.load(run_dir).meta
    assert meta["exit_code"] == 7 and meta["finished"]


def test_secrets_in_argv_and_env_never_reach_the_run_directory(run_profiled):
    secret_env = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
    secret_arg = "hunter2-correct-horse"
    cp, run_dir = run_profiled(
        "print('ok')\n",
        "--password",
        secret_arg,
        "--db=postgres://me:pa55word@127.0.0.1/db",
        extra_env={"AWS_SECRET_ACCESS_KEY": secret_env, "TORCH_SHOW_CPP_STACKTRACES": "1"},
    )
    assert cp.returncode == 0, cp.stderr
    blob = b"".join(p.read_bytes() for p in run_dir.iterdir() if p.is_file())
    for secret in (secret_env, secret_arg, "pa55word"):
        assert secret.encode() not in blob
    meta = gpufeed.load(run_dir).meta
    assert meta["command"][-3:] == ["--password", "***", "--db=postgres://me:***@127.0.0.1/db"]
    assert meta["env"]["AWS_SECRET_ACCESS_KEY"] == "***"
    assert meta["env"]["TORCH_SHOW_CPP_STACKTRACES"] == "1"


@pytest.fixture
def profile_cli(tmp_path, gpufeed_cli):
    """`profile_cli(*args)`: run `gpufeed profile ARGS` in tmp_path, capturing text output."""

    def run(*args: str) -> subprocess.CompletedProcess:
        cmd = gpufeed_cli("profile", *args)
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=60)

    return run


def test_no_command_is_a_clear_error(tmp_path, profile_cli):
    cp = profile_cli()
    assert cp.returncode == 2
    assert "no command to profile" in cp.stderr and "Traceback" not in cp.stderr


def test_missing_command_exits_127_before_anything_starts(tmp_path, profile_cli):
    cp = profile_cli("--out", str(tmp_path / "runs"), "--", "no-such-program-xyz")
    assert cp.returncode == 127
    assert "'no-such-program-xyz': no such executable" in cp.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("first_line", "code", "message"),
    [
        (
            b"#!/usr/bin/python3\r\n",
            127,
            "its #! line ends in a carriage return ('/usr/bin/python3' + '\\r'): the file "
            "has Windows (CRLF) line endings",
        ),
        (b"#!/no/such/python\n", 127, "its #! interpreter '/no/such/python' is not found"),
        (b"print('hi')\n", 126, "not a program and no #! line; run it with its interpreter"),
    ],
)
def test_a_script_that_exists_but_cannot_start_says_why(
    tmp_path, profile_cli, first_line, code, message
):
    # all three read "No such file or directory" or "Exec format error", for a file that is there
    script = tmp_path / "train.py"
    script.write_bytes(first_line + b"print('hi')\n")
    script.chmod(0o755)
    cp = profile_cli("--out", str(tmp_path / "runs"), "--", str(script))
    assert cp.returncode == code, cp.stderr
    assert message in cp.stderr and "Traceback" not in cp.stderr


@pytest.mark.parametrize("interval", ["0.01", "61", "-1"])
def test_interval_out_of_range_is_a_clear_error(tmp_path, profile_cli, interval):
    cp = profile_cli("--interval", interval, "--", sys.executable, "-c", "pass")
    assert cp.returncode == 2
    assert f"--interval {float(interval)} is out of range" in cp.stderr
    assert not (tmp_path / "gpufeed-runs").exists()


HANDLES_SIGNALS = """
import signal, sys, time
def bye(sig, frame):
    print("got", signal.Signals(sig).name, flush=True)
    sys.exit(40 + sig)
signal.signal(signal.SIGTERM, bye)
signal.signal(signal.SIGINT, bye)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_sent_to_gpufeed_reach_the_command(tmp_path, sig, gpufeed_cli, run_dir_from):
    script = tmp_path / "sig.py"
    script.write_text(HANDLES_SIGNALS)
    cmd = gpufeed_cli("profile", "--out", str(tmp_path / "runs"), "--", sys.executable, str(script))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert f"got {sig.name}" in out
    assert proc.returncode == 40 + sig, err
    assert gpufeed.load(run_dir_from(err)).meta["exit_code"] == 40 + sig


def test_an_empty_pythonpath_entry_still_means_the_working_directory(run_profiled, tmp_path):
    # `export PYTHONPATH=$PYTHONPATH:/opt/libs` with PYTHONPATH unset gives ":/opt/libs"
    (tmp_path / "mylib.py").write_text("VALUE = 42\n")  # in the working directory
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "uses_lib.py"
    script.write_text("import mylib\nprint('imported mylib', mylib.VALUE)\n")
    cp, _ = run_profiled(script, extra_env={"PYTHONPATH": os.pathsep + str(tmp_path / "none")})
    assert cp.returncode == 0, cp.stderr
    assert "imported mylib 42" in cp.stdout


def test_an_existing_sitecustomize_still_runs(run_profiled, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('user sitecustomize ran', flush=True)\n")
    script = "import sys\nprint('hooks', 'gpufeed.profiler.autopatch' in sys.modules)\n"
    cp, _ = run_profiled(script, extra_env={"PYTHONPATH": str(site)})
    assert cp.returncode == 0, cp.stderr
    assert "user sitecustomize ran" in cp.stdout
    assert "hooks True" in cp.stdout


CUDA_LOOP = """
import torch
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(512, 1024)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=64)
for _ in range(5):
    for (xb,) in loader:
        model(xb.cuda(non_blocking=True)).square().mean().backward()
        opt.step()
        opt.zero_grad()
"""


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs CUDA")
def test_cuda_steps_get_gpu_time_and_gpu_rows(run_profiled):
    cp, run_dir = run_profiled(CUDA_LOOP)
    assert cp.returncode == 0, cp.stderr
    run = gpufeed.load(run_dir)
    assert len(run.steps) == 40
    gpu_time = run.steps["gpu_time"]  # CUDA is initialized before the first batch
    assert gpu_time.notna().all() and (gpu_time > 0).all()
    # GPU work cannot take longer than the loop ran, plus what drained after its last step.
    span = run.steps["end"].max() - run.steps["start"].min()
    assert gpu_time.sum() <= span + 1.0
    assert run.meta["gpus"] and "gpu_unavailable" not in run.meta
    util = run.system[run.system["metric"] == "gpu.util"]["value"]
    assert len(util) > 0 and util.between(0, 100).all()
