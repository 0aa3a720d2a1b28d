"""Ray offload: a training host with 1 core for preprocessing, alone vs with a "remote" Ray node.

Both runs pin the training host to core 0 (the benchmark process, its loader workers, and in
the second run the Ray head with 1 CPU), and the second run adds a Ray worker node pinned to
the other core(s), standing in for a CPU-only machine:
1. local: Loader(num_workers=1), all preprocessing on core 0;
2. offload: Loader(cluster=..., num_workers=2): one actor on the head (core 0), one on the node;
3. offload only: the head has no CPU for Ray, one actor on the node; the host keeps the device
   stage (uint8 -> float, normalize) and the Ray driver.
Reported per run: images/s (second epoch, warm), CPU ms per image spent on the training host
(core-0 processes: this one, its workers, the head node's processes) and on the remote node,
and the bandwidth of the uint8 batches that came back through Ray.
Run: python benchmarks/ray_offload.py [--images 384] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from gpufeed.bench.raycluster import LocalCluster, use_loopback

use_loopback()

import torch  # noqa: E402

from gpufeed.data.augment import Augment  # noqa: E402
from gpufeed.data.loader import Loader  # noqa: E402
from gpufeed.data.packing import pack  # noqa: E402
from gpufeed.demo.synth import make_image_folder  # noqa: E402
from gpufeed.hardware import describe, hardware  # noqa: E402

BATCH = 32
AUG = Augment(size=(224, 224), load=2)


def _cpu(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def _tree(root: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(root)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def _epoch(loader: Loader, trainer: Any, host: Any, remote: Any) -> dict[str, float]:
    """Time one epoch; CPU seconds of the training process (with its loader workers), of all
    the host's processes (with the Ray head's) and of the remote node's."""
    h0, r0, m0 = _cpu(host()), _cpu(remote()), _cpu(trainer())
    t0 = time.perf_counter()
    n = sum(len(y) for _, y in loader)
    dt = time.perf_counter() - t0
    return {
        "images": n,
        "seconds": dt,
        "host_cpu": _used(h0, _cpu(host())),
        "remote_cpu": _used(r0, _cpu(remote())),
        "trainer_cpu": _used(m0, _cpu(trainer())),
    }


def _cluster_epoch(
    shards: Path, kw: dict[str, Any], head_cpus: int, host_core: list[int], node: list[int], me: int
) -> dict[str, float]:
    """One warm epoch with the head (`head_cpus`) on the host's core and a node on the others."""
    import ray

    with LocalCluster(head_cpus=head_cpus, cores=host_core) as c:
        c.connect()
        try:
            c.add_node(cpus=len(node), cores=node)
            pid = c.nodes[-1].pid
            loader = Loader(
                shards, BATCH, num_workers=head_cpus + len(node), cluster=c.address, **kw
            )
            list(loader)
            b0 = loader.stats()["remote_bytes"]

            def trainer() -> list[psutil.Process]:  # the nodes are this process's children too
                nodes = {p.pid for n in c.nodes for p in _tree(n.pid)}
                return [p for p in _tree(me) if p.pid not in nodes]

            r = _epoch(loader, trainer, lambda: trainer() + _tree(c.head.pid), lambda: _tree(pid))
            r["bytes"] = loader.stats()["remote_bytes"] - b0
            loader.close()
        finally:
            ray.shutdown()
    return r


def _measure(
    tmp: Path, images: int, host_core: list[int], node_cores: list[int]
) -> list[tuple[str, dict[str, float], int]]:
    """The three runs: (name, measurements, whether batches came through Ray)."""
    folder = make_image_folder(tmp / "images", images, 8, short_side=(256, 320))
    shards = tmp / "shards"
    pack(folder, shards, workers=1, progress=False)
    me = os.getpid()
    rows = []
    kw: dict[str, Any] = {"augment": AUG, "device": "cpu", "seed": 1}

    loader = Loader(shards, BATCH, num_workers=1, **kw)
    list(loader)  # warm: workers started, files cached
    local = _epoch(loader, lambda: _tree(me), lambda: _tree(me), list)
    loader.close()
    rows.append(("local: 1 worker on the host's core", local, 0))

    for head_cpus in (1, 0):
        r = _cluster_epoch(shards, kw, head_cpus, host_core, node_cores, me)
        where = "+ 1 actor on the host's core" if head_cpus else "only (host: device stage)"
        rows.append((f"Ray node on {len(node_cores)} other core(s) {where}", r, 1))
    return rows


def run(images: int, out: Path | None) -> str:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs at least 2 cores: one for the training host, one for the node")
    host_core, node_cores = cores[:1], cores[1:]
    machine = describe(hardware())
    os.sched_setaffinity(0, host_core)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gf-offload-") as tmp:
        rows = _measure(Path(tmp), images, host_core, node_cores)
    local, offload = rows[0][1], rows[1][1]
    lines = [
        "| run | images/s | host CPU ms/image (training process + its workers) | remote CPU "
        "ms/image | batches via Ray MB/s |",
        "|---|---|---|---|---|",
    ]
    for name, r, remote in rows:
        n = r["images"]
        mbs = f"{r['bytes'] / r['seconds'] / 1e6:,.1f}" if remote else "-"
        lines.append(
            f"| {name} | {n / r['seconds']:,.1f} | {1e3 * r['host_cpu'] / n:,.1f} "
            f"({1e3 * r['trainer_cpu'] / n:,.1f}) | "
            f"{1e3 * r['remote_cpu'] / n:,.1f} | {mbs} |"
        )
    speed = (offload["images"] / offload["seconds"]) / (local["images"] / local["seconds"])
    bpi = offload["bytes"] / offload["images"]
    lines.append("")
    lines.append(
        f"offload (host core + node) / local throughput: ×{speed:.2f}; uint8 batch bytes per "
        f"image: {bpi:,.0f}"
    )
    lines.append(f"hardware: {machine}; {images} images, batch {BATCH}, {AUG}")
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=384)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    run(args.images, args.out)


if __name__ == "__main__":
    main()
