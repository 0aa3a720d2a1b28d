"""System sampler: host CPU/memory/disk/network, the training process tree, and GPUs through NVML.

It runs outside the training processes: as a thread of the `gpufeed profile` parent, or as a child
process (`python -m gpufeed.profiler.sampler`) for the in-code API, which exits when its parent dies.
It never invents a reading: what cannot be read is absent, and why is written to the store's info.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpufeed.cores import allowed_cores, cgroup_memory_used, memory_cgroup
from gpufeed.profiler.session import (
    FLUSH_INTERVAL,
    check_interval,
    hostname,
    main_pids,
    system_store_path,
    warn_once,
)
from gpufeed.profiler.store import Store

Row = tuple[float, str, str, float]
_MAX_BUFFERED = 100_000  # sample rows kept for a store that cannot be written just now
JITTER = 0.25  # each gap between samples is the interval ±25%, see `next_gap`


def next_gap(interval: float, rng: random.Random) -> float:
    """Seconds to the next sample: `interval` on average, varied by ±JITTER so that samples never
    lock in phase with a loop whose steps take about the interval (every sample would then hold the
    same share of data wait, and the training process's CPU while waiting could not be told from
    its CPU while computing)."""
    return interval * rng.uniform(1 - JITTER, 1 + JITTER)


class Gpus:
    """NVML readings per GPU; each field of each GPU fails on its own and never stops sampling."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.info: list[dict[str, Any]] = []
        self.unavailable: str | None = None
        self.errors = 0
        self._off: set[tuple[int, str]] = set()
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            self.unavailable = (
                f"NVML unavailable ({type(e).__name__}: {e}); no GPU metrics recorded"
            )
            return
        if count == 0:
            self.unavailable = "NVML found no NVIDIA GPU; no GPU metrics recorded"
            return
        self._nvml = pynvml
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            except Exception as e:
                self.errors += 1
                sys.stderr.write(f"gpufeed: warning: GPU {i} not readable through NVML: {e}\n")
                continue
            name = name.decode() if isinstance(name, bytes) else str(name)
            self.handles.append((i, h))
            info = {"index": i, "name": name, "memory_total": int(mem)}
            cc = compute_capability(pynvml, h)
            if cc is not None:
                info["compute_capability"] = cc
            self.info.append(info)

    def read(self, now: float, with_pcie: bool) -> list[Row]:
        """One reading of every field of every GPU."""
        rows: list[Row] = []
        for i, h in self.handles:
            for field, fn in self._fields(with_pcie):
                if (i, field) in self._off:
                    continue
                try:
                    for metric, value in fn(h):
                        rows.append((now, metric, str(i), float(value)))
                except Exception as e:
                    self.errors += 1
                    if type(e).__name__ == "NVMLError_NotSupported":
                        self._off.add((i, field))  # asking again would only fail again
        return rows

    def _fields(
        self, with_pcie: bool
    ) -> list[tuple[str, Callable[[Any], list[tuple[str, float]]]]]:
        nv = self._nvml

        def util(h: Any) -> list[tuple[str, float]]:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return [("gpu.util", u.gpu), ("gpu.mem_util", u.memory)]

        def memory(h: Any) -> list[tuple[str, float]]:
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return [("gpu.mem_used", m.used), ("gpu.mem_total", m.total)]

        def power(h: Any) -> list[tuple[str, float]]:
            return [("gpu.power", nv.nvmlDeviceGetPowerUsage(h) / 1000.0)]

        def clock(h: Any) -> list[tuple[str, float]]:
            return [("gpu.sm_clock", nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))]

        def pcie(h: Any) -> list[tuple[str, float]]:
            rx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)
            tx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)
            return [("gpu.pcie_rx", rx * 1024.0), ("gpu.pcie_tx", tx * 1024.0)]  # KB/s

        fields = [("util", util), ("memory", memory), ("power", power), ("clock", clock)]
        return [*fields, ("pcie", pcie)] if with_pcie else fields


def compute_capability(nvml: Any, handle: Any) -> str | None:
    """A GPU's CUDA compute capability as "major.minor" (e.g. "8.0"); None where NVML cannot tell."""
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"{int(major)}.{int(minor)}"
    except Exception:  # an old driver or pynvml without the call: the fact stays absent
        return None


class Sampler:
    """Samples the host and the process tree under `root_pid` about every `interval` seconds (see
    `next_gap`) into a store."""

    def __init__(self, run_dir: str | Path, root_pid: int, interval: float) -> None:
        self.interval = check_interval(interval)
        self.run_dir = Path(run_dir)
        self.root_pid = root_pid
        self.host = hostname()
        self.gpus = Gpus()
        self._store = Store(system_store_path(run_dir, self.host))
        info: dict[str, Any] = {
            "host": self.host,
            "interval": self.interval,
            "gpus": self.gpus.info,
        }
        if self.gpus.unavailable:
            info["gpu_unavailable"] = self.gpus.unavailable
        try:
            self._store.write(info)
        except BaseException:
            with contextlib.suppress(Exception):
                self._store.close()
            raise
        self._procs: dict[int, psutil.Process] = {}
        self._rows: list[Row] = []
        self._proc_rows: list[tuple[float, int, str, float, float]] = []
        self._last_commit = time.monotonic()
        self._retry_after = 0.0  # after a failed commit, the next try waits (monotonic time)
        self._backoff = FLUSH_INTERVAL
        self.dropped = 0  # sample rows given up on because the store could not be written
        self._prev: dict[str, tuple[float, float]] = {}  # counter -> (time, value) for rates
        self._pcie_every = 1
        # Look for new processes about once a second; read the known ones on every tick.
        self._tree_every = max(1, round(1.0 / self.interval))
        self._fresh: set[int] = set()
        self._roles: dict[int, str] = {}
        self._ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cores = allowed_cores()
        self._memory_cgroup = memory_cgroup()  # a container's limit binds before the host's RAM
        self._last_cpu = psutil.cpu_times(percpu=True)  # deltas from here on
        self._rng = random.Random()

    def start(self) -> None:
        """Sample in a background thread until `stop()`."""
        self._thread = threading.Thread(target=self.run, name="gpufeed-sampler", daemon=True)
        self._thread.start()

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Sample until `stop()` is called or `until()` returns True."""
        _lower_priority()
        next_t = time.monotonic()
        while not self._stop.is_set() and not (until and until()):
            try:
                self.tick()
            except Exception as e:  # a bug of ours: this tick is lost, sampling goes on
                warn_once("sampler", f"system sample failed ({type(e).__name__}: {e})")
            next_t += next_gap(self.interval, self._rng)
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a slow NVML call): skip, do not burst
                next_t, delay = time.monotonic(), 0
            if self._stop.wait(delay):
                break
        self.flush()

    def stop(self) -> None:
        """Take a last sample, write everything, close the store."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        else:
            self.flush()
        with contextlib.suppress(Exception):
            self._store.close()

    def tick(self) -> None:
        """One sample of everything; failures of one source never stop the others."""
        now = time.time()
        rows = self._rows
        for source in (self._cpu, self._memory, self._io):
            with contextlib.suppress(Exception):
                rows.extend(source(now))
        if self.gpus.handles:
            t = time.monotonic()
            with_pcie = self._ticks % self._pcie_every == 0
            rows.extend(self.gpus.read(now, with_pcie))
            if with_pcie and self._ticks == 0:
                # PCIe counters take ~20 ms per call: keep them under a quarter of the interval.
                cost = time.monotonic() - t
                self._pcie_every = max(1, int(cost / (0.25 * self.interval)) + 1)
        with contextlib.suppress(Exception):
            self._proc_rows.extend(self._processes(now))
        self._ticks += 1
        now_m = time.monotonic()
        if now_m - self._last_commit >= FLUSH_INTERVAL and now_m >= self._retry_after:
            self.flush()

    def flush(self) -> None:
        """Commit buffered samples. If the store fails they are kept for a later try (backing off
        up to 30 s, at most _MAX_BUFFERED rows, the rest dropped and counted) and one warning is
        printed per run directory, not one per try."""
        try:
            self._store.write(system=self._rows, processes=self._proc_rows)
        except Exception as e:
            warn_once(
                str(self.run_dir),
                f"cannot write system samples to {self.run_dir}: {e}; "
                "dropping them, the command continues",
            )
            if len(self._rows) + len(self._proc_rows) > _MAX_BUFFERED:
                self.dropped += len(self._rows) + len(self._proc_rows)
                self._rows, self._proc_rows = [], []
            self._retry_after = time.monotonic() + self._backoff
            self._backoff = min(30.0, 2 * self._backoff)
            return
        self._rows, self._proc_rows = [], []
        self._last_commit = time.monotonic()
        self._retry_after, self._backoff = 0.0, FLUSH_INTERVAL

    # --- sources ----------------------------------------------------------------------------------

    def _cpu(self, now: float) -> list[Row]:
        # Deltas of /proc/stat's counters (psutil.cpu_times) per usable core. Not
        # psutil.cpu_times_percent: it divides by max(1 s, elapsed), so below a second per core an
        # idle core reads as mostly busy.
        times = psutil.cpu_times(percpu=True)
        last, self._last_cpu = self._last_cpu, times
        rows: list[Row] = []
        busy_sum = wait_sum = 0.0
        cores = [i for i in self._cores if i < min(len(times), len(last))] or range(len(times))
        for i in cores:
            busy, iowait = _core_shares(last[i], times[i])
            busy_sum += busy
            wait_sum += iowait
            rows.append((now, "cpu.core", str(i), busy))
        n = max(1, len(cores))
        rows.append((now, "cpu.util", "", busy_sum / n))
        rows.append((now, "cpu.iowait", "", wait_sum / n))
        return rows

    def _memory(self, now: float) -> list[Row]:
        """The host's memory in use and in all; in a container with a memory limit below the
        host's RAM, the container's working set and limit (what it is killed at)."""
        vm = psutil.virtual_memory()
        used, total = float(vm.total - vm.available), float(vm.total)
        if self._memory_cgroup is not None and self._memory_cgroup[1] < total:
            working_set = cgroup_memory_used(self._memory_cgroup[0])
            if working_set is not None:
                used, total = float(working_set), float(self._memory_cgroup[1])
        return [(now, "mem.used", "", used), (now, "mem.total", "", total)]

    def _io(self, now: float) -> list[Row]:
        counters: dict[str, float] = {}
        disk = psutil.disk_io_counters()
        if disk is not None:
            counters["disk.read"] = disk.read_bytes
            counters["disk.write"] = disk.write_bytes
        nics = psutil.net_io_counters(pernic=True)
        counters["net.rx"] = sum(v.bytes_recv for k, v in nics.items() if k != "lo")
        counters["net.tx"] = sum(v.bytes_sent for k, v in nics.items() if k != "lo")
        rows: list[Row] = []
        t = time.monotonic()
        for metric, value in counters.items():
            prev = self._prev.get(metric)
            self._prev[metric] = (t, value)
            if prev is not None and t > prev[0]:
                rows.append((now, metric, "", max(0.0, (value - prev[1]) / (t - prev[0]))))
        return rows

    def _processes(self, now: float) -> list[tuple[float, int, str, float, float]]:
        if self._ticks % self._tree_every == 0 or not self._procs:
            self._rescan_tree()
        mains = main_pids(self.run_dir, self.host)
        rows = []
        for pid, proc in list(self._procs.items()):
            try:
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    rss = proc.memory_info().rss
            except psutil.Error:
                del self._procs[pid]
                continue
            if pid in self._fresh:  # the first cpu_percent() of a process has no baseline
                self._fresh.discard(pid)
                continue
            role = "main" if pid in mains else self._roles.get(pid, "other")
            rows.append((now, pid, role, float(cpu), float(rss)))
        return rows

    def _rescan_tree(self) -> None:
        """Find the processes under the root (a scan of all of /proc, so not on every tick)."""
        try:
            root = self._procs.get(self.root_pid) or psutil.Process(self.root_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            self._procs = {}
            return
        parents: dict[int, int] = {}
        for p in tree:
            with contextlib.suppress(psutil.Error):
                parents[p.pid] = p.ppid()
        mains = main_pids(self.run_dir, self.host)
        me = os.getpid()
        procs: dict[int, psutil.Process] = {}
        for p in tree:
            if p.pid == me or p.pid not in parents:
                continue
            # Keep the Process object from earlier ticks: cpu_percent() measures since then.
            known = self._procs.get(p.pid)
            if known is not None and known.create_time() == p.create_time():
                procs[p.pid] = known
            else:
                procs[p.pid] = p
                self._fresh.add(p.pid)
            with contextlib.suppress(psutil.Error):
                self._roles[p.pid] = _guess_role(p, parents, mains)
        self._procs = procs


def _guess_role(proc: psutil.Process, parents: dict[int, int], mains: set[int]) -> str:
    """'worker' for a Python child (at any depth) of a training process, other helpers 'other'.

    DataLoader workers are forked or spawned by the training process (forkserver: by its server),
    so they descend from a main pid. The multiprocessing helpers (resource tracker, fork server)
    also do, and are told apart by their command line. The recorder also writes the exact worker
    pids it sees, and `gpufeed.load` corrects roles with them.
    """
    pid = parents.get(proc.pid)
    depth = 0
    while pid is not None and pid not in mains and depth < 4:
        pid = parents.get(pid)
        depth += 1
    if pid not in mains:
        return "other"
    cmd = " ".join(proc.cmdline())
    if "resource_tracker" in cmd or "forkserver" in cmd:
        return "other"
    return "worker" if "python" in proc.name().lower() or "python" in cmd else "other"


def _lower_priority() -> None:
    # Nice only the sampler's own thread (Linux applies niceness per thread), never the training.
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def _core_shares(before: Any, after: Any) -> tuple[float, float]:
    """(busy %, iowait %) of one core between two psutil.cpu_times readings. Guest time is already
    inside user/nice; a core whose counters did not move (tickless idle) was idle."""
    fields = [f for f in after._fields if f not in ("guest", "guest_nice")]
    delta = {f: max(0.0, getattr(after, f) - getattr(before, f)) for f in fields}
    total = sum(delta.values())
    if total <= 0:
        return 0.0, 0.0
    idle = delta.get("idle", 0.0)
    iowait = delta.get("iowait", 0.0)
    return 100.0 * max(0.0, total - idle - iowait) / total, 100.0 * iowait / total


def main(argv: list[str] | None = None) -> None:
    """`python -m gpufeed.profiler.sampler RUN_DIR --root-pid PID`: sample until PID exits (or a
    SIGTERM). A Ctrl-C is the profiled program's to handle: it may save and go on being sampled."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ap = argparse.ArgumentParser(prog="gpufeed-sampler")
    ap.add_argument("run_dir")
    ap.add_argument("--root-pid", type=int, required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    args = ap.parse_args(argv)
    try:
        sampler = Sampler(args.run_dir, args.root_pid, args.interval)
    except Exception as e:  # the profiled process goes on without system samples
        warn_once(args.run_dir, f"system sampler not started: {e}")
        return
    signal.signal(signal.SIGTERM, lambda *_: sampler._stop.set())
    parent = psutil.Process(args.root_pid)
    sampler.run(until=lambda: not parent.is_running())
    sampler._store.close()


if __name__ == "__main__":
    main()
