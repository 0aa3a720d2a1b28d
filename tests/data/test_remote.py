"""Loader(cluster=...): read, decode and augment on a real Ray cluster (head + worker nodes as
separate `ray start` processes on 127.0.0.1), uint8 batches streamed back.

The same batches as local workers, exactly once across ranks and resumption, corrupt samples
reported, bounded in flight, and a node killed mid-epoch loses and duplicates nothing.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from processes import wait_until

from gpufeed.bench.raycluster import LocalCluster, free_port, use_loopback
from gpufeed.data.augment import Augment
from gpufeed.data.batch import CorruptSampleError
from gpufeed.data.loader import Loader
from gpufeed.data.workers import LoaderWorkerError
from gpufeed.errors import GpufeedError, OptionError

use_loopback()
ray = pytest.importorskip("ray")

SMALL = Augment(size=(16, 16))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A head with no CPUs (nothing runs on the "training host") and two 1-CPU worker nodes."""
    with LocalCluster(head_cpus=0) as c:
        c.connect()
        try:
            c.add_node(cpus=1)
            c.add_node(cpus=1)
            yield c
        finally:
            ray.shutdown()


def _loader(data: Path, cluster: str | None, **kw: object) -> Loader:
    kw.setdefault("augment", SMALL)
    kw.setdefault("device", "cpu")
    kw.setdefault("dtype", torch.uint8)
    return Loader(data, 4, cluster=cluster, **kw)  # type: ignore[arg-type]


def _accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port` (a head that is up)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def _batches(loader: Loader) -> list[tuple[torch.Tensor, list[int]]]:
    return [(images.clone(), labels.tolist()) for images, labels in loader]


def test_cluster_batches_are_the_local_workers_batches(shards: Path, cluster: LocalCluster):
    with _loader(shards, None, num_workers=2, seed=3) as local:
        want = [_batches(local) for _ in range(2)]
    with _loader(shards, cluster.address, num_workers=2, seed=3) as remote:
        got = [_batches(remote) for _ in range(2)]
        stats = remote.stats()
    for e in range(2):
        assert [y for _, y in got[e]] == [y for _, y in want[e]]
        for (a, _), (b, _) in zip(got[e], want[e], strict=True):
            assert torch.equal(a, b)
    assert sorted(x for _, y in got[0] for x in y) == list(range(48))
    assert stats["cluster"] == cluster.address
    assert stats["remote_bytes"] >= 2 * 48 * 16 * 16 * 3  # uint8 images came over the wire


def test_float_batches_are_normalized_here_from_uint8(shards: Path, cluster: LocalCluster):
    with _loader(shards, None, num_workers=1, dtype=None) as local:
        want = _batches(local)
    with _loader(shards, cluster.address, num_workers=1, dtype=None) as remote:
        got = _batches(remote)
    tol = 0.5 / 255 / min(SMALL.std) + 1e-4  # uint8 rounding before normalization
    for (a, ya), (b, yb) in zip(got, want, strict=True):
        assert ya == yb and a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=tol, rtol=0)


def test_resume_mid_epoch_delivers_exactly_the_rest(shards: Path, cluster: LocalCluster):
    with _loader(shards, cluster.address, num_workers=2) as first:
        it = iter(first)
        seen = [int(x) for _ in range(5) for x in next(it)[1]]
        state = first.state_dict()
    with _loader(shards, cluster.address, num_workers=2) as second:
        second.load_state_dict(state)
        rest = [int(x) for _, y in second for x in y]
    assert sorted(seen + rest) == list(range(48))


def test_in_flight_batches_are_bounded(shards: Path, cluster: LocalCluster):
    """The actors make at most `depth` batches per worker ahead of what the loop took."""
    with _loader(shards, cluster.address, num_workers=2, prefetch=1) as loader:
        it = iter(loader)
        next(it)
        pool = loader._pool
        depth = 2  # prefetch + 1
        # 1 taken, 2 ready on the device at most, `depth` asked per worker
        bound = 1 + 2 + 1 + 2 * depth
        counts: list[int] = []
        for _ in range(20):
            counts.append(sum(pool.made_counts()))
        assert max(counts) <= bound
        assert len([x for _, y in it for x in y]) == 48 - 4


def test_a_corrupt_image_is_reported_by_key(corrupt_shards: Path, cluster: LocalCluster):
    with _loader(corrupt_shards, cluster.address, num_workers=1) as loader:
        labels = [int(x) for _, y in loader for x in y]
        stats = loader.stats()
    assert labels == [0] * 10
    assert stats["corrupt"] == 1
    (report,) = stats["corrupt_samples"]
    assert report["shard"].endswith("shard-00000.tar") and report["key"].endswith("_bad")
    assert "decode" in report["reason"]


def test_strict_raises_the_corrupt_sample_error(corrupt_shards: Path, cluster: LocalCluster):
    with (
        _loader(corrupt_shards, cluster.address, num_workers=1, strict=True) as loader,
        pytest.raises(CorruptSampleError, match="_bad"),
    ):
        list(loader)


def test_keys_and_members_come_back_with_their_images(shards: Path, cluster: LocalCluster):
    with _loader(shards, None, num_workers=2, seed=3, extras=("__key__", "cls")) as local:
        want = [(y.tolist(), keys, cls) for _, y, keys, cls in local]
    with _loader(shards, cluster.address, num_workers=2, seed=3, extras=("__key__", "cls")) as r:
        got = [(y.tolist(), keys, cls) for _, y, keys, cls in r]
    assert got == want and all(y == cls for y, _, cls in got)
    assert len({k for _, keys, _ in got for k in keys}) == 48


def test_an_actor_error_keeps_its_type_and_brings_its_traceback(
    shards: Path, cluster: LocalCluster
):
    aug = Augment(size=(16, 16), transform=lambda batch: 1 / 0)
    said = (
        r"Caught ZeroDivisionError in Ray loader actor of worker 0 \(pid \d+ on .*\) while making"
    )
    with (
        _loader(shards, cluster.address, num_workers=1, augment=aug) as loader,
        pytest.raises(ZeroDivisionError, match=said) as raised,
    ):
        next(iter(loader))
    message = str(raised.value)
    assert "Original Traceback (most recent call last):" in message and "in <lambda>" in message
    assert "shard " in message and message.rstrip().endswith("division by zero")


def test_gpu_preprocessing_on_a_cluster_is_refused(shards: Path):
    with pytest.raises(ValueError, match="choose one"):
        Loader(shards, 4, cluster="127.0.0.1:1", preprocess="gpu")


@pytest.mark.parametrize("value", ["", 6379])
def test_a_bad_cluster_option_is_refused_naming_it(shards: Path, value: object):
    with pytest.raises(ValueError, match="cluster="):
        Loader(shards, 4, cluster=value)  # type: ignore[arg-type]


def test_an_address_where_nothing_listens_is_refused_naming_the_option(shards: Path):
    with pytest.raises(ConnectionError, match=r"cluster='127\.0\.0\.1:\d+': nothing answers"):
        Loader(shards, 4, cluster=f"127.0.0.1:{free_port()}", num_workers=1)


@pytest.mark.parametrize("service", ["http", "silent"])
def test_an_address_where_another_service_listens_is_refused_in_seconds(shards: Path, service: str):
    # Ray retried such an address without end (a dashboard port, an S3 endpoint, a typo)
    if service == "http":
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), http.server.BaseHTTPRequestHandler
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port, stop = server.server_address[1], server.shutdown
    else:
        listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
        port, stop = listener.getsockname()[1], listener.close
    try:
        with pytest.raises(ConnectionError, match=r"answers, but not as a Ray cluster"):
            Loader(shards, 4, cluster=f"127.0.0.1:{port}", num_workers=1)
    finally:
        stop()


def test_cluster_address_errors_are_gpufeed_errors_and_still_connection_errors(shards: Path):
    # a plain ConnectionError: `except GpufeedError` (README: it catches them all) missed it
    with pytest.raises(GpufeedError, match=r"cluster='127\.0\.0\.1:\d+': nothing answers") as err:
        Loader(shards, 4, cluster=f"127.0.0.1:{free_port()}", num_workers=1)
    assert isinstance(err.value, ConnectionError)


def test_a_ray_version_mismatch_names_both_versions(monkeypatch: pytest.MonkeyPatch):
    # only Ray's first line was kept ("Version mismatch: The cluster was started with:") and the
    # advice was to start a cluster. No second Ray is installed here: its refusal is replayed.
    from gpufeed.data import remote

    refusal = (
        "Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.11.7"
        "\nThis process on node 127.0.0.1 was started with:\n    Ray: 2.60.0\n    Python: 3.11.7"
    )
    monkeypatch.setattr(remote, "_check_reachable", lambda address: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def init(**_: object) -> None:
        raise RuntimeError(refusal)

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(GpufeedError, match=r"Ray: 2\.59\.0 .* Ray: 2\.60\.0.*install the cluster"):
        remote.connect("127.0.0.1:6379")


def test_a_process_connected_to_another_cluster_is_refused_naming_the_option(
    shards: Path, cluster: LocalCluster
):
    # the actors started on the cluster this process was connected to; stats() named the other
    connected = ray.get_runtime_context().gcs_address
    with LocalCluster(head_cpus=0) as other:
        assert wait_until(lambda: _accepts(other.port), timeout=120)
        with pytest.raises(OptionError, match=rf"cluster='{other.address}': .* another Ray"):
            _loader(shards, other.address, num_workers=1)
    # the same cluster by another name is no other cluster
    with _loader(shards, f"localhost:{cluster.port}", num_workers=1) as same:
        assert len(next(iter(same))[1]) == 4
    assert ray.get_runtime_context().gcs_address == connected


def test_a_ray_client_address_in_a_process_that_drives_a_cluster_is_refused(
    shards: Path, cluster: LocalCluster
):
    # this process is the cluster's driver (ray.init, as Ray Tune/Train do): a ray:// address
    # was not compared, and the actors started on the connected cluster while stats() named the
    # other one
    assert wait_until(lambda: _accepts(cluster.client_port), timeout=120)
    with pytest.raises(OptionError, match=r"connected to a Ray cluster already \(as its driver"):
        _loader(shards, f"ray://127.0.0.1:{cluster.client_port}", num_workers=1)


def test_a_second_loader_finding_every_cpu_held_says_so(
    shards: Path, cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
):
    # train and val Loaders with the default num_workers (all the cluster's CPUs): the second
    # waited for a CPU, then said only "no Ray node is left"
    from gpufeed.data import remote

    monkeypatch.setattr(remote, "START_TIMEOUT_S", 5.0)
    with _loader(shards, cluster.address, num_workers=2) as train:
        it = iter(train)
        next(it)  # its 2 actors hold both CPUs
        val = _loader(shards, cluster.address)
        with val, pytest.raises(LoaderWorkerError, match=r"CPUs are all held by other actors"):
            next(iter(val))
        assert sum(len(labels) for _, labels in it) == 44  # train goes on: 48 less the first 4


def test_a_loader_closed_without_being_iterated_disconnects_what_it_connected(
    shards: Path, cluster: LocalCluster
):
    # cluster= connected the process; only the pool an iteration starts disconnected it
    code = textwrap.dedent(
        f"""
        import ray
        from gpufeed.data.loader import Loader
        Loader({str(shards)!r}, 4, cluster={cluster.address!r}, num_workers=1).close()
        print("CONNECTED", ray.is_initialized())
        """
    )
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert "CONNECTED False" in cp.stdout, cp.stderr[-2000:]


def test_without_ray_the_error_names_the_extra_to_install(shards: Path):
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if ray were not installed
        "from gpufeed.data.loader import Loader\n"
        f"Loader({str(shards)!r}, 4, cluster='127.0.0.1:6379')\n"
    )
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert cp.returncode != 0
    assert "pip install 'gpufeed[ray]'" in cp.stderr.strip().splitlines()[-1]


def test_a_cluster_with_no_cpus_yet_says_so(shards: Path):
    # a head started with --num-cpus 0 (README's first step), no node joined: the first batch
    # said "could not start a loader actor within 60 s" after half a second
    code = textwrap.dedent(
        f"""
        import ray
        from gpufeed.bench.raycluster import LocalCluster
        from gpufeed.data.loader import Loader
        from gpufeed.data.workers import LoaderWorkerError
        with LocalCluster(head_cpus=0) as c:
            c.connect()
            try:
                next(iter(Loader({str(shards)!r}, 4, cluster=c.address, num_workers=1)))
            except LoaderWorkerError as e:
                print("ERROR", e)
            finally:
                ray.shutdown()
        """
    )
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert "ERROR" in cp.stdout, cp.stderr[-2000:]
    assert "has no CPUs (no node has joined" in cp.stdout and "ray start --address" in cp.stdout


@pytest.mark.slow
def test_a_whole_cluster_dying_mid_epoch_raises_and_disconnects(shards: Path):
    # Ray's core ended the process a minute later with no exception (no chance to checkpoint).
    # The nodes die while the loader waits (its ready batches made): a head that dies while the
    # process reads a batch from Ray's object store ends it at once (Ray: "The connection to the
    # plasma store is failed. Terminate the process."), which no code can catch.
    code = textwrap.dedent(
        f"""
        import time, ray
        from gpufeed.bench.raycluster import LocalCluster
        from gpufeed.data.loader import Loader
        from gpufeed.data.workers import LoaderWorkerError
        c = LocalCluster(head_cpus=0)
        c.connect(); c.add_node(cpus=1); ray.shutdown()  # the Loader connects itself
        loader = Loader({str(shards)!r}, 2, cluster=c.address, num_workers=1, prefetch=1)
        it = iter(loader)
        next(it)
        deadline = time.monotonic() + 120
        while not loader._feeder._queues[0].full() and time.monotonic() < deadline:
            time.sleep(0.05)
        nodes = [c.head, *c.nodes]
        for p in nodes:  # the head first
            c.kill(p)
        try:
            for _ in it:
                pass
        except LoaderWorkerError as e:
            print("ERROR", e)
        print("CONNECTED", ray.is_initialized())
        """
    )
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert "ERROR" in cp.stdout, f"exit code {cp.returncode}\n{cp.stderr[-2000:]}"
    assert "restart" in cp.stdout and "CONNECTED False" in cp.stdout
    assert cp.returncode == 0


@pytest.mark.slow
def test_torchrun_ranks_share_the_cluster_exactly_once(
    shards: Path, cluster: LocalCluster, tmp_path: Path
):
    """Two real torchrun ranks, each its own actors on the cluster; each epoch exactly once."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        from gpufeed.bench.raycluster import use_loopback
        use_loopback()
        import torch.distributed as dist
        from gpufeed.data.augment import Augment
        from gpufeed.data.loader import Loader
        dist.init_process_group("gloo")
        loader = Loader({str(shards)!r}, 6, num_workers=1, augment=Augment(size=(8, 8)),
                        device="cpu", cluster={cluster.address!r})
        epochs = [[int(x) for _, y in loader for x in y] for _ in range(2)]
        open({str(tmp_path)!r} + f"/rank{{dist.get_rank()}}.txt", "w").write(
            "\\n".join(" ".join(map(str, e)) for e in epochs))
        loader.close()
        dist.destroy_process_group()
        """)
    )
    port = free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)]  # fmt: skip
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert cp.returncode == 0, cp.stderr[-3000:]
    epochs = [
        [
            [int(x) for x in line.split()]
            for line in (tmp_path / f"rank{r}.txt").read_text().splitlines()
        ]
        for r in range(2)
    ]
    for e in range(2):
        assert sorted(epochs[0][e] + epochs[1][e]) == list(range(48))


@pytest.mark.slow
def test_a_node_killed_mid_epoch_loses_and_duplicates_nothing(shards: Path, cluster: LocalCluster):
    """An actor on each 1-CPU node; one node is killed mid-epoch: the other redoes its batches.
    Then the last node is killed: a clear error, not a hang. (Two fresh nodes replace them.)"""
    doomed, last = cluster.nodes[-2:]
    loader = _loader(shards, cluster.address, num_workers=2, prefetch=1)
    try:
        it = iter(loader)
        seen = [int(x) for _ in range(3) for x in next(it)[1]]
        cluster.kill(doomed)
        seen += [int(x) for _, y in it for x in y]
        assert sorted(seen) == list(range(48))
        assert loader.stats()["remote_actors_lost"] >= 1
        assert sorted(int(x) for _, y in loader for x in y) == list(range(48))  # next epoch
        loader._pool.start_timeout = 5.0
        cluster.kill(last)
        with pytest.raises(LoaderWorkerError, match="no Ray node is left"):
            list(loader)
    finally:
        loader.close()
        for node in (doomed, last):
            cluster.nodes.remove(node)
        assert wait_until(lambda: ray.cluster_resources().get("CPU", 0) == 0, timeout=60)
        cluster.add_node(cpus=1)
        cluster.add_node(cpus=1)
