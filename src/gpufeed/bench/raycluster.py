"""A throwaway Ray cluster on 127.0.0.1 for tests and benchmarks: a head and worker nodes, each
its own `ray start --block` process tree with a CPU limit (and optionally pinned to cores).

Everything lives in its own temp dir and is torn down by killing the nodes' process trees, so
no Ray process outlives it and no other Ray on the machine is touched (no `ray stop`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

import gpufeed

# `ray start` resolves 127.0.0.1 to the host's interface address; pin every node to loopback
_RAY_START = (
    "import sys, ray._private.services as s; "
    "s.get_node_ip_address = lambda address=None: '127.0.0.1'; "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"
)
# a killed node is declared dead in about a second, not half a minute
_FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def use_loopback() -> None:
    """Make this process's Ray driver use 127.0.0.1 (call before `import ray`)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


class LocalCluster:
    """`head_cpus` on the head node (0: nothing is scheduled there); `add_node` adds workers."""

    def __init__(self, head_cpus: int = 0, cores: list[int] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gfray-", dir="/tmp"))  # socket paths are short
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        src = str(Path(gpufeed.__file__).resolve().parents[1])
        self.env = {
            **os.environ,
            **_FAST_HEALTH,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
        }
        self.env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        self.nodes: list[subprocess.Popen[bytes]] = []
        head = ["--head", "--port", str(self.port), "--temp-dir", str(self.dir)]
        self.client_port = free_port()  # Ray Client's server: ray://127.0.0.1:client_port
        head += ["--include-dashboard=false", "--ray-client-server-port", str(self.client_port)]
        self.head = self._start(head, head_cpus, cores, "head")

    def _start(
        self, args: list[str], cpus: int, cores: list[int] | None, name: str
    ) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-c", _RAY_START, "start", *args, "--num-cpus", str(cpus)]
        cmd += ["--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
        for flag in (  # each node its own ports: several nodes share this machine
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--runtime-env-agent-port",
            "--node-manager-port",
            "--object-manager-port",
        ):
            cmd += [flag, str(free_port())]
        if cores:
            cmd = ["taskset", "-c", ",".join(map(str, cores)), *cmd]
        log = open(self.dir / f"{name}-{len(self.nodes)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.nodes.append(proc)
        return proc

    def add_node(self, cpus: int = 1, cores: list[int] | None = None) -> subprocess.Popen[bytes]:
        """Start a worker node with `cpus` CPUs and wait until the connected driver sees them (a
        node that fails to start on a busy machine is started again, once); returns its
        `ray start` process."""
        import ray

        want = ray.cluster_resources().get("CPU", 0) + cpus
        for attempt in range(2):
            proc = self._start(["--address", self.address], cpus, cores, "node")
            try:
                self.wait_for_cpus(want)
                return proc
            except RuntimeError:
                if attempt:
                    raise
                self.kill(proc)
                self.nodes.remove(proc)
        raise AssertionError("unreachable")

    def connect(self) -> None:
        """Connect this process to the cluster as a Ray driver."""
        import ray

        ray.init(address=self.address, log_to_driver=False)

    def wait_for_cpus(self, cpus: float, timeout: float = 120.0) -> None:
        """Wait until the connected driver sees `cpus` CPUs in the cluster."""
        import ray

        deadline = time.monotonic() + timeout
        while ray.cluster_resources().get("CPU", 0) < cpus:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray cluster at {self.address} did not reach {cpus} CPUs")
            if any(p.poll() is not None for p in self.nodes):
                raise RuntimeError(f"a Ray node exited; see the logs in {self.dir}")
            time.sleep(0.2)

    @staticmethod
    def tree(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
        """The node's processes: `ray start` and everything it started."""
        try:
            root = psutil.Process(proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill a node at once (SIGKILL to its whole process tree), as a crashed machine would."""
        procs = self.tree(proc)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)
        proc.wait(timeout=10)

    def close(self) -> None:
        """Kill every node (workers first) and remove the temp dir."""
        for proc in reversed(self.nodes):
            self.kill(proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
