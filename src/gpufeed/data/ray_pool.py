"""The Ray pool: Loader workers on a Ray cluster: read, decode and augment on the cluster's CPU nodes, stream
uint8 batches back; the training process keeps only the device stage.

`RayPool` is a pool behind the same interface as `workers.WorkerPool` (start / get / free /
close); its actors are `ray_maker.BatchMaker`s. Batch `at` is named by its index g in the rank's endless stream (epoch · B + batch);
plan worker w makes the batches g ≡ w (mod W), as with local workers. The pool asks Ray actors
(one CPU each, spread over the nodes) for each worker's next `depth` batches and no more, so at
most W · depth batches are ever made and not yet taken (back-pressure: memory on both sides is
capped); the training host copies each into one of two host slots, taken in turn. An actor makes a worker's batches in order from a stream of its own
(`BatchPlan.worker_batches`), so a worker's region is read sequentially, as locally. When an
actor or its node dies, the batches asked of it and not yet taken are asked again, in order, of
a surviving actor: none is lost, and since the pool takes one result per index, none is
duplicated. The error comes only when no actor can be started on the cluster any more. An actor
that is alive but delivers no batch within `worker_timeout` (`watchdog.deadline`: automatic,
10× its slowest batch, at least 120 s) is a LoaderWorkerError naming it, its pid and host.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np

from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.ray_maker import BatchMaker
from gpufeed.data.slot_meta import SlotMeta
from gpufeed.data.slots import Slots
from gpufeed.data.watchdog import deadline, process_state, what_to_do
from gpufeed.data.worker_errors import WorkerFailure
from gpufeed.data.workers import POLL_S, LoaderWorkerError, Stopped
from gpufeed.errors import GpufeedError, OptionError
from gpufeed.extras import require

HEAD_CHECK_S = 2.0  # seconds: how often a waiting pool checks that the cluster's head answers
START_TIMEOUT_S = 60.0  # how long new actors may take to start before the pool gives up on them
_session: dict[str, Any] = {"ours": False, "open": set()}  # did connect() connect us; open pools


class ClusterError(GpufeedError, ConnectionError):
    """The Ray cluster named by `cluster=` cannot be reached or does not answer (still a
    ConnectionError, as it was)."""


def import_ray() -> Any:
    """The `ray` module, or MissingExtra naming the extra that installs it."""
    return require("ray")


def connect(address: str) -> bool:
    """Connect this process to the Ray cluster at `address` ("ray://HOST:PORT", "HOST:PORT" or
    "auto") unless it is connected already; connected to another cluster, an OptionError naming
    `cluster=` (the actors would start there). True if this call connected it:
    `release_cluster` disconnects it once no pool uses it."""
    ray = import_ray()
    _check_reachable(address)
    if ray.is_initialized():
        _check_connected_to(address)
        return False
    try:
        ray.init(address=address, log_to_driver=False, namespace="gpufeed")
    except (ConnectionError, ValueError, RuntimeError) as e:
        text = " ".join(str(e).split()) or type(e).__name__
        if text.startswith("Version mismatch"):  # its versions are on the lines after the first
            raise ClusterError(
                f"cluster={address!r}: {text[:600]}; install the cluster's Ray (and Python) "
                "version here, or start the cluster with this one's"
            ) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ClusterError(
            f"cluster={address!r}: no Ray cluster to connect to ({first}); start one with "
            "`ray start --head --port 6379` and pass cluster='HEAD_IP:6379' (see README)"
        ) from None
    _session["ours"] = True
    return True


def release_cluster() -> None:
    """Disconnect this process from the cluster if `connect` connected it and no pool uses it
    (a Loader made with cluster= and closed without being iterated, or the last pool closed)."""
    if _session["ours"] and not _session["open"]:
        _session["ours"] = False
        with contextlib.suppress(Exception):
            import_ray().shutdown()


def _check_connected_to(address: str) -> None:
    """An OptionError naming `cluster=` where this process is connected to another Ray cluster
    than `address` names. A GCS address HOST:PORT is compared ("auto": RAY_ADDRESS if set, else
    whichever cluster is connected); a "ray://" address (a client server, on another port) is
    refused where this process is a cluster's driver, not a Ray Client."""
    wanted = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    host, sep, port = wanted.rpartition(":")
    if wanted.startswith("ray://"):
        if not import_ray().util.client.ray.is_connected():  # a driver of a cluster, no client
            raise OptionError(
                f"cluster={address!r}: this process is connected to a Ray cluster already (as "
                "its driver, not through Ray Client), where the loader actors would start; pass "
                "that cluster's address HOST:PORT, or call ray.shutdown() before making the Loader"
            )
        return
    if not sep or not port.isdigit():
        return
    try:
        connected = str(import_ray().get_runtime_context().gcs_address or "")
    except Exception:  # a client connection may not say
        return
    c_host, _, c_port = connected.rpartition(":")
    if not c_host:
        return
    same_host = _ips(host) & _ips(c_host) or (_on_this_machine(host) and _on_this_machine(c_host))
    if c_port != port or not same_host:
        raise OptionError(
            f"cluster={address!r}: this process is connected to another Ray cluster already, at "
            f"{connected}, where the loader actors would start; pass cluster={connected!r}, or "
            "call ray.shutdown() before making the Loader"
        )


def _ips(host: str) -> set[str]:
    """The addresses `host` resolves to (itself if it does not resolve)."""
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host.strip("[]"), None)}
    except OSError:
        return {host.strip("[]")}


def _on_this_machine(host: str) -> bool:
    """Whether `host` is this machine (loopback or one of its addresses: Ray reports the
    node's address for a cluster given as 127.0.0.1)."""
    for ip in _ips(host):
        try:
            with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
                s.bind((ip, 0))
            return True
        except OSError:
            continue
    return False


def _check_reachable(address: str) -> None:
    """Fail in seconds, naming the option, where Ray would retry for a minute: nothing listens."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and the like: Ray finds the cluster
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
    except OSError as e:
        raise ClusterError(
            f"cluster={address!r}: nothing answers at {host}:{port} ({e.strerror or e}); start "
            "the head with `ray start --head --port PORT` and check the address (see README)"
        ) from None
    with conn:
        if not _answers_grpc(conn):  # Ray would retry it without end
            raise ClusterError(
                f"cluster={address!r}: {host}:{port} answers, but not as a Ray cluster (another "
                "service, or a dashboard port such as 8265); give the head's GCS port "
                "('HEAD_IP:6379', as `ray start --head` prints it) or 'ray://HEAD_IP:10001'"
            )


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client
# server) answers with a SETTINGS frame of its own
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _answers_grpc(conn: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the server on `conn` speaks HTTP/2, as every gRPC server does: its first frame,
    read within `timeout`, is SETTINGS (type 4)."""
    conn.settimeout(timeout)
    try:
        conn.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            more = conn.recv(9 - len(head))
            if not more:
                return False
            head += more
    except OSError:
        return False
    return head[3] == 4


def cluster_cpus(timeout: float = 10.0, free: bool = False) -> int:
    """CPUs of the live nodes of the connected cluster (`free`: those no actor holds now);
    ClusterError where its head does not answer within `timeout` s (Ray would wait for it until
    its core ends the process)."""
    ray = import_ray()
    pool = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-ray-cpus")
    ask = ray.available_resources if free else ray.cluster_resources
    try:
        resources = pool.submit(ask).result(timeout=timeout)
    except FutureTimeout:
        raise ClusterError(f"the Ray cluster's head did not answer within {timeout:g} s") from None
    finally:
        pool.shutdown(wait=False)
    return int(resources.get("CPU", 0))


def cluster_option(cluster: str | None, preprocess: str) -> str | None:
    """Check the Loader's `cluster` option: None, or a Ray address (preprocessing on CPUs)."""
    if cluster is None:
        return None
    if not isinstance(cluster, str) or not cluster.strip():
        raise OptionError(
            f"cluster={cluster!r}: pass a Ray address such as 'HEAD_IP:6379', "
            "'ray://HEAD_IP:10001' or 'auto', or None to preprocess on this machine"
        )
    if preprocess == "gpu":
        raise OptionError(
            "cluster= runs decoding on the cluster's CPU nodes, preprocess='gpu' on this GPU: "
            "choose one (preprocess='cpu' with cluster=..., or no cluster)"
        )
    connect(cluster.strip())  # a wrong address fails here, not at the first batch
    return cluster.strip()


def default_remote_workers(cluster: str) -> int:
    """The cluster's CPUs shared out among the job's ranks (WORLD_SIZE), at least 1."""
    connect(cluster)
    world = int(os.environ.get("WORLD_SIZE", 1))
    return max(1, cluster_cpus() // max(1, world))


class RayPool:
    """The plan's workers as Ray actors on the cluster at `address` (training-process side)."""

    def __init__(
        self,
        plan: BatchPlan,
        slots: Slots,
        address: str,
        *,
        depth: int,
        start_timeout: float | None = None,
        timeout: float | None = None,
    ) -> None:
        ray = import_ray()
        self.plan, self.slots, self.address = plan, slots, address
        self.timeout, self.slowest = timeout, 0.0  # worker_timeout; the slowest batch's seconds
        self.depth = max(1, depth)
        self.start_timeout = START_TIMEOUT_S if start_timeout is None else start_timeout
        self.gen = 0
        self.processes: list[Any] = []  # no local worker processes
        self.bytes_received = 0
        self.actors_lost = 0
        connect(address)
        _session["open"].add(id(self))
        self._cls = ray.remote(num_cpus=1, max_restarts=0)(BatchMaker)
        self._plan_ref = ray.put(plan)
        self._actors: list[Any] = []
        self._owner: dict[int, Any] = {}  # plan worker -> actor
        self._where: dict[int, tuple[int, str]] = {}  # id(actor) -> (pid, host)
        self._queue: dict[int, deque[tuple[int, Any]]] = {}  # plan worker -> asked (g, ref)
        self._next_g: dict[int, int] = {}
        self._slot = 0  # the feeder is done with a slot before it asks for the next batch
        self._head_checked = time.monotonic()
        try:
            self._grow(plan.workers)
        except BaseException:
            self.close()
            raise

    # --- actors --------------------------------------------------------------------------------

    def _grow(self, n: int) -> None:
        """Start up to `n` actors (one CPU each, spread over the nodes); raise if none starts."""
        ray = import_ray()
        if not self._actors:  # all lost: a dead head would hang cluster_cpus() until Ray aborts
            self._check_head(now=True)
        try:
            n = min(n, cluster_cpus())
        except ConnectionError as e:
            raise self._fatal(f"lost the Ray cluster at {self.address!r}: {e}") from None
        if n == 0 and not self._actors:
            raise self._fatal(
                f"no Ray node is left to preprocess on: the cluster at {self.address!r} has no "
                "CPUs (no node has joined a head started with --num-cpus 0, or every node is "
                "gone); add a node with `ray start --address HEAD_IP:PORT` (see README)"
            )
        new = [
            self._cls.options(scheduling_strategy="SPREAD").remote(self._plan_ref, self.slots.spec)
            for _ in range(n)
        ]
        refs = [a.ready.remote() for a in new]
        done, _ = (
            ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout) if refs else ([], [])
        )
        for actor, ref in zip(new, refs, strict=True):
            where = None
            if ref in done:
                with contextlib.suppress(ray.exceptions.RayError):
                    where = ray.get(ref)
            if where:
                self._actors.append(actor)
                self._where[id(actor)] = where
            else:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        if not self._actors:
            held = ""
            with contextlib.suppress(Exception):  # a CPU left but none free: others hold them
                if cluster_cpus() > 0 and cluster_cpus(free=True) < 1:
                    held = (
                        "; or its CPUs are all held by other actors (another Loader on this "
                        "cluster? Loaders on one cluster share its CPUs: pass num_workers= to "
                        "each so that together they fit)"
                    )
            raise self._fatal(
                f"no Ray node is left to preprocess on: the cluster at {self.address!r} could not "
                f"start a loader actor (1 CPU) within {self.start_timeout:.0f} s; add a node with "
                f"`ray start --address HEAD_IP:PORT` (see README){held}"
            )
        for w in range(self.plan.workers):  # workers without a live owner get one
            if self._owner.get(w) not in self._actors:
                self._owner[w] = self._least_busy()

    def _fatal(self, message: str) -> LoaderWorkerError:
        """Disconnect now and return the error to raise: a connected process whose head dies
        is ended by Ray's core a minute later, with no exception the training loop could catch."""
        self.close()
        return LoaderWorkerError(message)

    def _least_busy(self) -> Any:
        load = {id(a): 0 for a in self._actors}
        for a in self._owner.values():
            if id(a) in load:
                load[id(a)] += 1
        return min(self._actors, key=lambda a: load[id(a)])

    def _lost(self, actor: Any) -> None:
        """`actor` (or its node) died: its workers' asked batches are asked again elsewhere."""
        ray = import_ray()
        self.actors_lost += 1
        with contextlib.suppress(Exception):
            ray.kill(actor)
        self._actors = [a for a in self._actors if a is not actor]
        orphans = [w for w, a in self._owner.items() if a is actor]
        for w in orphans:
            del self._owner[w]
        if not self._actors:
            self._grow(self.plan.workers)
        for w in orphans:
            if w not in self._owner:
                self._owner[w] = self._least_busy()
            asked = [g for g, _ in self._queue.get(w, ())]
            self._queue[w] = deque((g, self._ask(w, g)) for g in asked)

    def _ask(self, worker: int, g: int) -> Any:
        return self._owner[worker].make.remote(worker, g)

    def _fill(self, worker: int) -> None:
        q = self._queue[worker]
        while len(q) < self.depth:
            g = self._next_g[worker]
            q.append((g, self._ask(worker, g)))
            self._next_g[worker] = g + self.plan.workers

    # --- the pool interface ----------------------------------------------------------------------

    def start(self, at: Position) -> None:
        """Every worker starts (again) from `at`; batches asked for before are dropped."""
        self.gen += 1
        w_count, g0 = self.plan.workers, self._index(at)
        for w in range(w_count):
            self._next_g[w] = g0 + (w - g0) % w_count
            self._queue[w] = deque()
            self._fill(w)

    def _index(self, at: Position) -> int:
        return at.epoch * self.plan.batches + at.batch

    def get(self, at: Position, stop: threading.Event) -> tuple[int, int, SlotMeta]:
        """(0, slot, meta) of batch `at`, copied into one of `slots`' few slots (taken in turn);
        raises the actor's error if making it failed, LoaderWorkerError if no node is left,
        Stopped once `stop` is set."""
        ray = import_ray()
        w, g = self.plan.worker_of(at), self._index(at)
        since = time.monotonic()
        while True:
            q = self._queue[w]
            if not q or q[0][0] != g:
                raise LoaderWorkerError(f"Ray loader pool expected batch {at} next")
            ref = q[0][1]
            try:
                ready, _ = ray.wait([ref], timeout=POLL_S)
            except (OSError, ray.exceptions.RaySystemError) as e:  # the head went away
                self._check_head(now=True)
                raise self._fatal(
                    f"lost the Ray cluster at {self.address!r} ({e}); restart it and resume from "
                    "a checkpoint (Loader.state_dict())"
                ) from None
            if not ready:
                if stop.is_set():
                    raise Stopped
                self._check_head()
                self._check_deadline(w, at, since)
                continue
            try:
                got, images, labels, meta = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # raised by the batch's own making
                cause = getattr(e, "cause", None)
                if isinstance(cause, WorkerFailure):
                    raise cause.error() from None
                raise (cause if isinstance(cause, BaseException) else e) from None
            except ray.exceptions.RayError:  # the actor, its node or the result is gone
                self._lost(self._owner[w])
                since = time.monotonic()  # asked again, of another actor
                continue
            break
        q.popleft()
        self._fill(w)
        self.slowest = max(self.slowest, meta.seconds)
        if got != at:
            raise LoaderWorkerError(f"Ray loader actor made batch {got}, expected {at}")
        k = self._slot = (self._slot + 1) % self.slots.per_worker
        index = self.slots.index(0, k)
        n = len(labels)
        np.copyto(self.slots.images[index][:n].numpy(), images)  # results are read-only views
        np.copyto(self.slots.labels[index][:n].numpy(), labels)
        self.bytes_received += images.nbytes + labels.nbytes
        return 0, k, meta

    def _check_deadline(self, w: int, at: Position, since: float) -> None:
        """Raise LoaderWorkerError once batch `at` has been waited for past the deadline."""
        limit = deadline(self.timeout, self.slowest)
        idle = time.monotonic() - since
        if limit is None or idle <= limit:
            return
        pid, host = self._where.get(id(self._owner[w]), (0, "?"))
        state, hint = ("unknown (on another node)", "")
        if host == socket.gethostname():
            state, hint = process_state(pid)
        raise LoaderWorkerError(
            f"Ray loader actor of worker {w} (pid {pid} on {host}, process state: {state}) made "
            f"no progress for {idle:.1f} s while the training loop waited for batch {at.batch} "
            f"of epoch {at.epoch}, which it was asked to make.{hint} "
            + what_to_do(self.timeout, self.slowest, limit)
        )

    def _check_head(self, now: bool = False) -> None:
        """Raise LoaderWorkerError (every `HEAD_CHECK_S` of waiting, or `now`) once the
        cluster's head no longer answers: Ray's own core would end this process a minute later
        without an exception, so that the training loop could not save a checkpoint."""
        t = time.monotonic()
        if not now and t - self._head_checked < HEAD_CHECK_S:
            return
        self._head_checked = t
        ray = import_ray()
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=HEAD_CHECK_S).close()
        except OSError as e:
            raise self._fatal(
                f"the Ray cluster's head at {host}:{port} is gone ({e.strerror or e}): no node "
                "is left to preprocess on; restart the cluster and resume from a checkpoint "
                "(Loader.state_dict())"
            ) from None

    def free(self, worker: int, slot: int) -> None:
        """Nothing to give back: the feeder is done with a slot before it asks for the next."""

    def made_counts(self) -> list[int]:
        """Batches each live actor has made (to check back-pressure)."""
        ray = import_ray()
        return ray.get([a.count.remote() for a in self._actors])

    @property
    def actors(self) -> int:
        return len(self._actors)

    @property
    def pids(self) -> list[int]:
        return []

    def close(self) -> None:
        """Stop the actors; disconnect from the cluster if this pool connected and is the last."""
        with contextlib.suppress(ImportError):
            ray = import_ray()
            for a in self._actors:
                with contextlib.suppress(Exception):
                    ray.kill(a)
            self._actors, self._queue = [], {}
            _session["open"].discard(id(self))
            release_cluster()
