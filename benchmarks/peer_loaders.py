"""Peer loaders side by side: the same JPEGs through gpufeed, DALI's CPU pipeline, SPDL,
torchdata.nodes, the classic DataLoader + Pillow, WebDataset and litdata, on CPU.

The work per image is the same for every loader: decode, random-resized crop to 224×224 (scale
0.08-1, ratio 3/4-4/3), horizontal flip with p=0.5, ImageNet normalization; batches of 32 as
N×3×224×224 float32 on the CPU; two worker processes or two threads (`--workers`). Each loader is
built the way its authors document it:

- gpufeed: `gpufeed.data.Loader` on shards packed from the folder (`gpufeed pack`); also with
  `worker_nice=0` ("gpufeed-nice0"), the nice level of every other loader's workers;
- DALI: `@pipeline_def(device_id=None)` with `fn.readers.file`, `fn.decoders.image_random_crop`
  (device "cpu"), `fn.resize`, `fn.crop_mirror_normalize`, read with `DALIGenericIterator`;
- SPDL: `PipelineBuilder` over the file paths, a `pipe` stage that demuxes each JPEG and decodes it
  through an FFmpeg filter (crop, bilinear scale, hflip, rgb24), `aggregate(32)` and a stage that
  converts the frames to one tensor and normalizes it;
- torchdata.nodes: the `NodesDataLoader` of its migration guide (SamplerWrapper, Batcher,
  ParallelMapper of "map and collate", Prefetcher, Loader), with threads and with processes;
- DataLoader + Pillow: a map-style folder dataset doing torchvision's PIL recipe op for op
  (RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize), shuffle, persistent workers;
- WebDataset: tars written by `wds.ShardWriter`, `WebDataset(...).shuffle().decode("pil")`,
  the same Pillow recipe, `.batched(32)` and `WebLoader`;
- litdata: `litdata.optimize` of the raw JPEG bytes, `StreamingDataset` decoding with Pillow,
  `StreamingDataLoader`.

A loader whose package is not installed is reported as "not installed" with its pip line, and one
that fails as "failed" with the error: the script runs with gpufeed alone. Every loader runs in a
fresh process, round after round, the loaders alternating within each round so that background
load hits them alike. In each run the first batches are a warm-up; then one epoch's worth of images
is timed (epochs chained, so the epoch boundary is in the window): img/s by wall clock, and the CPU
time of the whole process tree per image (psutil: the process, all its threads and its child
processes, live or reaped). Also measured in every round: the decode-only limit, simplejpeg
decoding every file at full size in `--workers` processes, nothing else.

Variants: "full" (the photo-like set at ImageNet-like sizes, short side 300-500) and "256" (the
same images pre-resized to short side 256 by `gpufeed pack --resize 256`; the folder-based loaders
read those very JPEG bytes).

Run: python benchmarks/peer_loaders.py [--images 1200] [--rounds 3] [--workers 2]
     [--variants full,256] [--loaders gpufeed,dali,...] [--out FILE.md|FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from peer_recipes import BATCH, FACTORIES, PEERS, SIZE, installed, list_folder

VARIANTS = ("full", "256")
BASELINE = "dali"  # the named baseline of the ratio column
CLASSIC = "dataloader"
OTHER_DISTS = ("torch", "numpy", "simplejpeg", "psutil", "pillow")


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- measuring


def tree_cpu() -> tuple[float, int, int]:
    """(CPU seconds, processes, threads) of this process tree: this process (all its threads),
    every live descendant, and every reaped one (the children_* times, which hold the reaped
    descendants' own and their reaped descendants')."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    procs, threads = 1, me.num_threads()
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system + c.children_user + c.children_system
            procs += 1
            threads += child.num_threads()
        except psutil.Error:  # gone (its time is in its parent's children_*) or a zombie
            continue
    return total, procs, threads


def batches(epoch: Iterable[Any]) -> Iterator[Any]:
    """Epoch after epoch of the loader, `set_epoch` called where it has one."""
    for n in itertools.count():
        if hasattr(epoch, "set_epoch"):
            epoch.set_epoch(n)
        yield from epoch


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    """One run of one loader: warm-up batches, then one epoch's worth of images timed."""
    loader, close = FACTORIES[cfg["loader"]](cfg)
    stream = batches(loader)
    first = next(stream)[0]
    shape, dtype = list(first.shape), str(first.dtype)
    if shape[1:] != [3, SIZE, SIZE] or dtype != "torch.float32" or first.device.type != "cpu":
        raise RuntimeError(f"batch is {dtype} {shape} on {first.device}, not float32 N×3×224×224")
    mean = float(first.mean())
    for _ in range(cfg["warmup"] - 1):
        next(stream)
    cpu0, _, _ = tree_cpu()
    t0 = time.perf_counter()
    n = 0
    while n < cfg["images"]:
        n += int(next(stream)[0].shape[0])
    seconds = time.perf_counter() - t0
    cpu1, procs, threads = tree_cpu()
    if close is not None:
        close()
    return {
        "images": n,
        "seconds": seconds,
        "img_s": n / seconds,
        "cpu_ms": 1e3 * (cpu1 - cpu0) / n,
        "procs": procs,
        "threads": threads,
        "shape": shape,
        "mean": mean,
    }


def child_main(cfg: dict[str, Any]) -> None:
    cfg["folder"], cfg["shards"] = Path(cfg["folder"]), Path(cfg["shards"])
    warnings.simplefilter("ignore")
    out = measure(cfg)
    print("PEER-RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no waiting on a peer's lingering threads or atexit handlers


def run_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Measure one loader in a fresh process (its own session, so that worker processes it
    leaves behind are ended with it); a crash or a timeout is a result, not an error."""
    import signal
    import tempfile

    cmd = [sys.executable, __file__, "--child", json.dumps(cfg)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            proc.wait(timeout)
            result = None
        except subprocess.TimeoutExpired:
            result = {"error": f"timed out after {timeout:.0f} s"}
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the run's leftover workers, if any
        proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    for line in stdout.splitlines():
        if line.startswith("PEER-RESULT ") and result is None:
            return json.loads(line[len("PEER-RESULT ") :])
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    why = lines[-1] if lines else f"exit status {proc.returncode}, no output"
    return result or {"error": why[:300], "stderr": stderr[-4000:]}


_DATAS: list[bytes] = []  # the files, read before the pool forks so no bytes are sent to it


def _decode_part(part: tuple[int, int]) -> float:
    import simplejpeg

    cpu = time.process_time()
    for d in _DATAS[part[0] : part[1]]:
        simplejpeg.decode_jpeg(d)
    return time.process_time() - cpu


def decode_limit(folder: Path, workers: int) -> dict[str, float]:
    """The decode-only limit: simplejpeg full-size decode of every file in `workers`
    processes, nothing else; img/s and CPU ms per image."""
    _DATAS[:] = [Path(p).read_bytes() for p, _ in list_folder(folder)]
    bounds = [round(i * len(_DATAS) / workers) for i in range(workers + 1)]
    parts = list(itertools.pairwise(bounds))
    pool = mp.get_context("fork").Pool(workers)
    pool.map(_decode_part, [(a, min(b, a + 8)) for a, b in parts])  # warm-up
    t = time.perf_counter()
    cpu = pool.map(_decode_part, parts, chunksize=1)
    seconds = time.perf_counter() - t
    pool.close()  # not terminate(): a library's signal handler would print a stack on SIGTERM
    pool.join()
    n = len(_DATAS)
    _DATAS.clear()
    return {"img_s": n / seconds, "cpu_ms": 1e3 * sum(cpu) / n}


# --------------------------------------------------------------------------- data


def resized_folder(shards: Path, out: Path) -> Path:
    """The JPEGs stored in `shards` as an image folder `out/<label>/<key>.jpg` (once)."""
    from gpufeed.data.dataset import ShardDataset

    if (out / ".complete").exists():
        return out
    for s in ShardDataset(shards, shuffle=False).iter_worker(0, 1):
        path = out / f"{s.label:04d}" / (s.key.replace("/", "_") + ".jpg")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(s.data)
    (out / ".complete").touch()
    return out


def make_data(cache: Path, n: int, variants: list[str]) -> dict[str, dict[str, Path]]:
    """Per variant, the image folder and gpufeed's shards holding the very same JPEG bytes."""
    from gpufeed.data.packing import pack
    from gpufeed.demo.synth import make_image_folder

    root = make_image_folder(cache / f"images-{n}", n, 10)
    data = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if "full" in variants:
            pack(root, cache / f"shards-{n}", progress=False)  # as-is: the files' own bytes
            data["full"] = {"folder": root, "shards": cache / f"shards-{n}"}
        if "256" in variants:
            small = cache / f"shards-{n}-r256"
            pack(root, small, resize=256, quality=90, progress=False)
            data["256"] = {
                "folder": resized_folder(small, cache / f"images-{n}-r256"),
                "shards": small,
            }
    return data


# --------------------------------------------------------------------------- report


def _median_range(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.0f}"
    return f"{statistics.median(xs):.0f} [{min(xs):.0f}–{max(xs):.0f}]"


def table(results: dict[str, Any], variant: str, loaders: list[str]) -> list[str]:
    runs = results["runs"][variant]
    limit = statistics.median(r["img_s"] for r in results["limits"][variant])

    def rate(key: str) -> float | None:
        ok = [r["img_s"] for r in runs.get(key, []) if "img_s" in r]
        return statistics.median(ok) if ok else None

    base, classic = rate(BASELINE), rate(CLASSIC)
    lines = [
        "| loader | img/s median [min–max] | CPU-ms/img | share of decode-only limit "
        "| × DALI-CPU | × DataLoader | processes / threads |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in loaders:
        name = PEERS[key].name
        status = results["status"].get(key)
        if status:
            lines.append(f"| {name} | {status} | – | – | – | – | – |")
            continue
        ok = [r for r in runs.get(key, []) if "img_s" in r]
        failed = [r["error"] for r in runs.get(key, []) if "error" in r]
        if not ok:
            why = failed[0].replace("|", "/") if failed else "no run"
            lines.append(f"| {name} | failed: {why} | – | – | – | – | – |")
            continue
        rates = [r["img_s"] for r in ok]
        med = statistics.median(rates)
        cpu = statistics.median(r["cpu_ms"] for r in ok)
        note = f" ({len(failed)} of {len(ok) + len(failed)} runs failed)" if failed else ""
        lines.append(
            f"| {name} | {_median_range(rates)}{note} | {cpu:.2f} | {100 * med / limit:.0f}% "
            f"| {f'{med / base:.2f}×' if base else '–'} "
            f"| {f'{med / classic:.2f}×' if classic else '–'} "
            f"| {ok[-1]['procs']} / {ok[-1]['threads']} |"
        )
    lim = results["limits"][variant]
    lines += [
        "",
        f"Decode-only limit ({variant}): "
        f"{_median_range([r['img_s'] for r in lim])} img/s, "
        f"{statistics.median(r['cpu_ms'] for r in lim):.2f} CPU-ms/img "
        f"(simplejpeg, full-size decode, {results['workers']} processes).",
    ]
    return lines


def report(results: dict[str, Any], loaders: list[str]) -> str:
    hw = results["hardware"]
    versions = ", ".join(f"{k} {v}" for k, v in results["versions"].items())
    lines = [
        f"# Peer loaders ({results['date']})",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Hardware: {results['hardware_line']}; {hw.get('cpu_cores')} usable cores, "
        f"{hw.get('memory_total', 0) / 2**30:.0f} GiB memory; Python {results['python']}.",
        "",
        f"Load (`uptime`) before: {results['uptime_before']}; after: {results['uptime_after']}.",
        "",
        f"Versions: {versions}.",
        "",
        f"Data: {results['images']} photo-like JPEGs (gpufeed.demo.synth, 10 classes). Work per "
        f"image: decode, random-resized crop to 224 (scale 0.08–1, ratio 3/4–4/3), horizontal "
        f"flip, ImageNet normalization; batches of {BATCH}, N×3×224×224 float32 on the CPU; "
        f"{results['workers']} workers or threads each; {results['rounds']} alternating rounds, "
        f"each loader in a fresh process; per run {results['warmup']} warm-up batches, then one "
        f"epoch's worth of images timed. CPU-ms/img: CPU time of the whole process tree "
        f"(threads and child processes) over the timed window, per image.",
    ]
    for variant in results["variants"]:
        lines += ["", f"## Variant {variant}", "", *table(results, variant, loaders)]
    return "\n".join(lines) + "\n"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        la = os.getloadavg()
        return f"load average: {la[0]:.2f}, {la[1]:.2f}, {la[2]:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="worker processes or threads each")
    ap.add_argument("--variants", default="full,256", help="comma-separated: full, 256")
    ap.add_argument(
        "--loaders", default=",".join(PEERS), help=f"comma-separated of: {', '.join(PEERS)}"
    )
    ap.add_argument("--warmup", type=int, default=None, help="warm-up batches (default 2×workers)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per loader run")
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/bench"))
    ap.add_argument("--out", type=Path, default=None, help="FILE.md (markdown) or FILE.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return
    loaders = [s.strip() for s in args.loaders.split(",") if s.strip()]
    variants = [s.strip() for s in args.variants.split(",") if s.strip()]
    for bad in [k for k in loaders if k not in PEERS]:
        ap.error(f"--loaders: unknown loader {bad!r}; choose from {', '.join(PEERS)}")
    for bad in [v for v in variants if v not in VARIANTS]:
        ap.error(f"--variants: unknown variant {bad!r}; choose from {', '.join(VARIANTS)}")
    if args.images < BATCH:
        ap.error(f"--images must be at least one batch ({BATCH})")
    warmup = args.warmup or max(2, 2 * args.workers)

    from gpufeed.hardware import describe, hardware

    status = {k: f"not installed (`{PEERS[k].pip}`)" for k in loaders if not installed(k)}
    for key, why in status.items():
        print(f"{PEERS[key].name}: {why}, skipped", flush=True)
    data = make_data(args.cache.resolve(), args.images, variants)
    hw = hardware()
    dists = dict.fromkeys(["gpufeed", *OTHER_DISTS, *(d for k in loaders for d in PEERS[k].dists)])
    versions = {d: v for d in dists if (v := version(d))}
    if "spdl" in loaders and "spdl" not in status:
        try:  # the FFmpeg libraries SPDL found
            from spdl.io.utils import get_ffmpeg_versions

            versions["FFmpeg (libavcodec)"] = ".".join(
                map(str, get_ffmpeg_versions()["libavcodec"])
            )
        except Exception as e:  # a broken FFmpeg shows up as the runs' error
            print(f"SPDL: FFmpeg versions unavailable: {e}", flush=True)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": shlex.join(["python", "benchmarks/peer_loaders.py", *sys.argv[1:]]),
        "hardware": hw,
        "hardware_line": describe(hw),
        "python": sys.version.split()[0],
        "versions": versions,
        "images": args.images,
        "rounds": args.rounds,
        "workers": args.workers,
        "warmup": warmup,
        "variants": variants,
        "status": status,
        "runs": {v: {} for v in variants},
        "limits": {v: [] for v in variants},
        "uptime_before": uptime(),
    }
    print(f"load before: {results['uptime_before']}", flush=True)
    for r in range(args.rounds):
        for variant in variants:
            lim = decode_limit(data[variant]["folder"], args.workers)
            results["limits"][variant].append(lim)
            print(
                f"round {r + 1}, {variant}: decode-only limit {lim['img_s']:.0f} img/s, "
                f"{lim['cpu_ms']:.2f} CPU-ms/img",
                flush=True,
            )
            order = [k for k in loaders if k not in status]
            if r % 2:  # alternate the order round by round
                order.reverse()
            for key in order:
                cfg = {
                    "loader": key,
                    "folder": str(data[variant]["folder"]),
                    "shards": str(data[variant]["shards"]),
                    "workers": args.workers,
                    "images": args.images,
                    "warmup": warmup,
                }
                out = run_child(cfg, args.timeout)
                results["runs"][variant].setdefault(key, []).append(out)
                if "error" in out:
                    print(f"round {r + 1}, {variant}, {key}: failed: {out['error']}", flush=True)
                else:
                    print(
                        f"round {r + 1}, {variant}, {key}: {out['img_s']:.0f} img/s, "
                        f"{out['cpu_ms']:.2f} CPU-ms/img",
                        flush=True,
                    )
    results["uptime_after"] = uptime()
    print(f"load after: {results['uptime_after']}", flush=True)
    text = report(results, loaders)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.suffix == ".json":
            args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
        else:
            args.out.write_text(text)


if __name__ == "__main__":
    main()
