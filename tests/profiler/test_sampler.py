"""System sampler: host metrics, the process tree with roles, and GPU metrics only where NVML reads them."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import statistics
import subprocess
import sys
import time

import psutil
import pytest

from gpufeed.profiler.sampler import JITTER, Gpus, Sampler, _core_shares, next_gap
from gpufeed.profiler.session import ProfileError, hostname, steps_store_path, system_store_path
from gpufeed.profiler.store import read_store

# A "training" process with one Python child (a stand-in DataLoader worker) and a non-Python one.
TREE = """
import subprocess, sys, time
w = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: pass"])
o = subprocess.Popen(["sleep", "30"])
print(w.pid, o.pid, flush=True)
time.sleep(30)
"""


@pytest.fixture
def tree(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    worker, other = map(int, proc.stdout.readline().split())
    yield proc.pid, worker, other
    for pid in (worker, other, proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    proc.wait()


def test_samples_host_metrics_and_the_process_tree_with_roles(tmp_path, tree):
    main, worker, other = tree
    steps_store_path(tmp_path, hostname(), main).write_bytes(b"")  # main registers by its store
    sampler = Sampler(tmp_path, main, interval=0.1)
    sampler.start()
    time.sleep(0.8)
    sampler.stop()
    data = read_store(system_store_path(tmp_path, hostname()))
    metrics = {m for _, m, _, _ in data["system"]}
    assert {"cpu.util", "cpu.core", "cpu.iowait", "mem.used", "mem.total"} <= metrics
    assert {"disk.read", "disk.write", "net.rx", "net.tx"} <= metrics
    cores = {d for _, m, d, _ in data["system"] if m == "cpu.core"}
    assert cores == {str(i) for i in range(os.cpu_count())}
    assert all(0 <= v <= 100 for _, m, _, v in data["system"] if m.startswith("cpu."))
    roles = {pid: role for _, pid, role, _, _ in data["processes"]}
    assert roles[main] == "main" and roles[worker] == "worker" and roles[other] == "other"
    busy = [cpu for _, pid, _, cpu, _ in data["processes"] if pid == worker]
    assert max(busy) > 30  # the spinning worker shows up as busy
    assert data["info"]["interval"] == 0.1


def test_gaps_between_samples_vary_around_the_interval_so_they_cannot_lock_onto_the_steps():
    gaps = [next_gap(0.1, random.Random(seed)) for seed in range(2000)]
    assert all(0.1 * (1 - JITTER) <= g <= 0.1 * (1 + JITTER) for g in gaps)
    assert abs(statistics.fmean(gaps) - 0.1) < 0.003  # the interval asked for, on average
    # A loop whose steps take one interval would put the same share of data wait in every sample.
    assert statistics.pstdev(gaps) > 0.1 * 0.1


def test_the_sampler_keeps_those_varied_gaps(tmp_path):
    sampler = Sampler(tmp_path, os.getpid(), interval=0.05)
    ticks: list[float] = []
    real_tick = sampler.tick
    sampler.tick = lambda: (ticks.append(time.monotonic()), real_tick())  # type: ignore[method-assign]
    sampler.run(until=lambda: len(ticks) >= 40)
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert statistics.pstdev(gaps) > 0.005  # fixed 50-ms gaps would vary by scheduling noise only


def test_no_nvml_means_no_gpu_rows_and_a_reason():
    gpus = Gpus()
    if gpus.handles:
        pytest.skip("this machine has NVIDIA GPUs")
    assert gpus.info == [] and "NVML" in gpus.unavailable
    assert gpus.read(0.0, with_pcie=True) == []


@pytest.mark.parametrize("interval", [0.01, 120, float("nan")])
def test_interval_outside_the_accepted_range_is_rejected(tmp_path, interval):
    with pytest.raises(ProfileError, match="out of range"):
        Sampler(tmp_path, os.getpid(), interval)


def test_the_child_sampler_exits_when_its_parent_dies(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    sampler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufeed.profiler.sampler",
            str(tmp_path),
            "--root-pid",
            str(parent.pid),
            "--interval",
            "0.1",
        ]
    )
    parent.wait()
    assert sampler.wait(timeout=20) == 0
    assert len(read_store(system_store_path(tmp_path, hostname()))["system"]) > 0


class NVMLError_NotSupported(Exception):
    pass


class NVMLError_GPUIsLost(Exception):
    pass


class StandInNvml:
    """NVML as seen with two GPUs where GPU 1 fell off the bus; GPU 0 has no power sensor."""

    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES = 0, 1

    def __init__(self) -> None:
        self.power_calls = 0

    def _check(self, h):
        if h == 1:
            raise NVMLError_GPUIsLost("GPU is lost")

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check(h)
        return type("U", (), {"gpu": 97, "memory": 40})()

    def nvmlDeviceGetMemoryInfo(self, h):
        self._check(h)
        return type("M", (), {"used": 2**30, "total": 2**34})()

    def nvmlDeviceGetPowerUsage(self, h):
        self.power_calls += 1
        raise NVMLError_NotSupported("no power sensor")

    def nvmlDeviceGetClockInfo(self, h, kind):
        self._check(h)
        return 1410

    def nvmlDeviceGetPcieThroughput(self, h, kind):
        self._check(h)
        return 1000


def test_a_failing_gpu_or_field_never_stops_the_others():
    # NVML cannot run without a driver; the error handling around it is checked with a stand-in.
    gpus = Gpus.__new__(Gpus)
    gpus.handles, gpus.errors, gpus._off = [(0, 0), (1, 1)], 0, set()
    gpus._nvml = nvml = StandInNvml()
    first = gpus.read(5.0, with_pcie=True)
    second = gpus.read(5.2, with_pcie=False)
    readings = {(m, d): v for _, m, d, v in first}
    assert readings[("gpu.util", "0")] == 97 and readings[("gpu.pcie_rx", "0")] == 1000 * 1024
    assert not any(d == "1" for _, _, d, _ in first + second)  # the lost GPU: nothing invented
    assert "gpu.power" not in {m for _, m, _, _ in first}
    assert {m for _, m, _, _ in second} == {
        "gpu.util",
        "gpu.mem_util",
        "gpu.mem_used",
        "gpu.mem_total",
        "gpu.sm_clock",
    }
    assert nvml.power_calls == 2  # unsupported on a GPU: asked once per GPU, then no more
    assert gpus.errors > 0


def _proc_stat() -> dict[int, list[int]]:
    """Per-core counters straight from /proc/stat (jiffies): user nice system idle iowait irq
    softirq steal [guest guest_nice]."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *values = line.split()
            if name.startswith("cpu") and name != "cpu":
                out[int(name[3:])] = [int(v) for v in values]
    return out


def _busy_from(before: list[int], after: list[int]) -> float:
    d = [b - a for a, b in zip(before, after, strict=True)][:8]  # guest is inside user
    total = sum(d)
    return 100.0 * (total - d[3] - d[4]) / total if total else 0.0


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc/stat")
def test_per_core_busy_agrees_with_proc_stat_deltas_on_usable_cores(tmp_path):
    """psutil.cpu_times_percent() divides by max(1 s, elapsed): at 0.2 s an idle core read 80%."""
    sampler = Sampler(tmp_path, os.getpid(), interval=0.2)
    for _ in range(3):
        before = _proc_stat()
        sampler._last_cpu = psutil.cpu_times(percpu=True)
        time.sleep(0.3)
        rows = sampler._cpu(time.time())
        after = _proc_stat()
        cores = {int(d): v for _, m, d, v in rows if m == "cpu.core"}
        assert set(cores) == set(os.sched_getaffinity(0))
        for core, busy in cores.items():
            # the two reads are a few ms apart: allow a few jiffies of difference
            assert busy == pytest.approx(_busy_from(before[core], after[core]), abs=12)
        util = next(v for _, m, _, v in rows if m == "cpu.util")
        assert util == pytest.approx(sum(cores.values()) / len(cores))


def test_a_core_whose_counters_did_not_move_was_idle():
    t = psutil.cpu_times(percpu=True)[0]
    assert _core_shares(t, t) == (0.0, 0.0)
    idle = t._replace(idle=t.idle + 0.2)
    assert _core_shares(t, idle) == (0.0, 0.0)  # psutil.cpu_times_percent says 80% busy here
    busy = t._replace(user=t.user + 0.15, idle=t.idle + 0.05)
    assert _core_shares(t, busy)[0] == pytest.approx(75.0)


def test_in_a_container_with_a_memory_limit_its_working_set_and_limit_are_recorded(
    tmp_path, monkeypatch
):
    """In a pod the host's RAM is not what the job is killed at: a memory rule projected
    against 512 GiB of a node would miss a 32 GiB limit by hours."""
    import gpufeed.profiler.sampler as sampler_module

    group = tmp_path / "cg"
    group.mkdir()
    (group / "memory.current").write_text(str(900 << 20))
    (group / "memory.stat").write_text(f"anon {800 << 20}\ninactive_file {100 << 20}\n")
    monkeypatch.setattr(sampler_module, "memory_cgroup", lambda: (group, 1 << 30))
    (tmp_path / "run").mkdir()
    sampler = Sampler(tmp_path / "run", os.getpid(), interval=0.1)
    rows = {metric: value for _, metric, _, value in sampler._memory(0.0)}
    assert rows == {"mem.used": float(800 << 20), "mem.total": float(1 << 30)}
    # a limit above the host's RAM binds nothing: the host's figures stay
    monkeypatch.setattr(sampler_module, "memory_cgroup", lambda: (group, 1 << 62))
    sampler = Sampler(tmp_path / "run", os.getpid(), interval=0.1)
    rows = {metric: value for _, metric, _, value in sampler._memory(0.0)}
    assert rows["mem.total"] == float(psutil.virtual_memory().total)
