"""Does the GPU wait? The same ResNet training loop fed by every input pipeline, side by side, on one
CUDA GPU: synthetic batches (the ceiling), the classic torchvision ImageFolder + DataLoader, gpufeed
on CPU workers (full-size and pre-resized shards), gpufeed with GPU decoding (nvJPEG through
torchvision, NVIDIA DALI's decoder: `Loader(decoder="dali")`, and nvImageCodec's), gpufeed with
the CPU workers decoding and the GPU doing the rest of the augmentation (`decoder="workers"`), and
NVIDIA DALI's own reader pipeline; at augmentation loads 1 and 12 (L × (hflip, vflip, rotation)). Rows
that need DALI run where `nvidia.dali` imports; rows that cannot run are skipped, saying why.

Each pipeline trains in its own fresh process, so its first epoch includes its own start-up and
cuDNN autotuning. Printed per pipeline: steady images/s (epochs after the first), share of the
synthetic ceiling, mean GPU utilization (NVML), the first-batch wait of every epoch, the time of
the first epoch (pipeline start included) and the data-wait share. Also the loaders alone (no model).

Run (one command, on a CUDA machine): python benchmarks/gpu_feed.py --out benchmarks/results/gpu-feed
Options: --images 8192 --batch-size 256 --workers (cores-1) --loads 1 12 --epochs 4 --model resnet50
`--smoke`: a few images, ResNet-18 on 64×64, one load, two epochs; without CUDA it runs on the CPU the rows
that can (synthetic, gpufeed with DALI's CPU decoder or with `decoder="workers"`) and says why it
skips the others.
`--only NAME ...` runs the pipelines whose names contain one of the NAMEs; with the `--out` of an
earlier call it adds (or replaces) those rows beside the earlier ones, so a run that does not fit
in one call can be finished by the next (shares use the synthetic row, whichever call made it).

Device time: all rows (about 25) take 10-15 minutes on one H100 or H200 (25-36 s per training
row, 16 s per loader-alone row, data generation 30-90 s), more than one 600-s call. On
2026-11-28 nine GPU rows with nvImageCodec took 266 s on an H200 (benchmarks/results/
gpu-feed-h200). Not yet run on a GPU: `--only "DALI"` (its decoder and its own pipeline), once
DALI is carried over (below).

DALI on a GPU machine without registry access: its wheels travel with the working tree, which
carries at most 64 MiB per call, so they go in 60 MiB pieces over consecutive calls (the machine
stays warm between them). Here, in the repo root (Python 3.12 there):

    echo /.whl/ >> .git/info/exclude
    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d /tmp/dali-wheels \
      nvidia-dali-cuda130==2.4.0 nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.3.2.43 \
      nvidia-nvjpeg2k-cu13==0.11.0.51 nvidia-nvtiff-cu13==0.8.0.82 \
      nvidia-libnvcomp-cu13==5.3.0.16 astunparse==1.6.3 gast==0.7.0 six==1.17.0 \
      optree==0.20.0 nvtx==0.2.17 makefun==1.16.0 libcst==1.9.0 simplejpeg
    cd /tmp/dali-wheels && for w in *.whl; do split -b 60M -d "$w" "$w.part-"; rm "$w"; done

then, per call, put the next pieces (at most 60 MiB together) alone in .whl/ and carry it:
`run(command="mkdir -p /tmp/w && cp .whl/* /tmp/w/", carry=[".whl"])`; the last call joins them,
installs and runs the benchmark:

    cd /tmp/w && for p in *.part-00; do cat "${p%.part-00}".part-* > "${p%.part-00}"; done && \
    cd - && python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/w/*.whl && \
    PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_feed.py --out $OUT/gpu-feed
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


# --- data -------------------------------------------------------------------------------------


def _write_images(args: tuple[str, int, int, int, int]) -> int:
    """Worker: photo-like JPEGs start..stop into root/<class>/ (ImageFolder layout)."""
    import numpy as np
    import simplejpeg

    from gpufeed.demo.synth import _image, _pink_bank

    root, start, stop, classes, quality = args
    rng = np.random.default_rng(start)
    bank = _pink_bank(rng, 1024)
    for i in range(start, stop):
        s = int(rng.integers(300, 501))
        a = float(rng.uniform(0.75, 1.5))
        h, w = (s, int(s * a)) if a >= 1 else (int(s / a), s)
        img = _image(rng, bank, min(h, 1000), min(w, 1000))
        data = simplejpeg.encode_jpeg(img, quality=quality, colorsubsampling="420")
        path = Path(root) / f"class_{i % classes:03d}" / f"img_{i:06d}.jpg"
        path.write_bytes(data)
    return stop - start


def make_data(cache: Path, n: int, quality: int) -> tuple[Path, Path, Path]:
    """(image folder, full-size shards, shards pre-resized to 256), made once in parallel."""
    from gpufeed.data.packing import pack

    root = cache / f"images-{n}-q{quality}"
    done = root / ".complete"
    classes = 100
    if not done.exists():
        for c in range(classes):
            (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
        procs = os.cpu_count() or 1
        bounds = [n * k // procs for k in range(procs + 1)]
        parts = [
            (str(root), a, b, classes, quality) for a, b in itertools.pairwise(bounds) if b > a
        ]
        with get_context("fork").Pool(procs) as pool:
            pool.map(_write_images, parts)
        done.write_text("ok")
    full, small = cache / f"shards-{n}-q{quality}", cache / f"shards-{n}-q{quality}-r256"
    workers = os.cpu_count() or 1
    if not (full / ".complete").exists():
        pack(root, full, workers=workers, progress=False)
        (full / ".complete").write_text("ok")
    if not (small / ".complete").exists():
        pack(root, small, resize=256, quality=90, workers=workers, progress=False)
        (small / ".complete").write_text("ok")
    return root, full, small


# --- one pipeline, in its own process -------------------------------------------------------------


class GpuSampler:
    """NVML utilization.gpu (share of time a kernel ran) every 50 ms, while `active`."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.active = False
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            index = int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or 0)
            self._nvml, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            self._nvml = None
            return
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            if self.active:
                self.samples.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu))

    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def _classic(cfg: dict[str, Any]) -> Any:
    import torch
    import torchvision.datasets as D
    import torchvision.transforms as T

    tf = [T.RandomResizedCrop(cfg["size"])]
    for _ in range(cfg["load"]):
        tf += [T.RandomHorizontalFlip(), T.RandomVerticalFlip(), T.RandomRotation(15)]
    tf += [T.ToTensor(), T.Normalize(MEAN, STD)]
    return torch.utils.data.DataLoader(
        D.ImageFolder(cfg["images"], T.Compose(tf)),
        batch_size=cfg["batch_size"],
        shuffle=True,
        num_workers=cfg["workers"],
        pin_memory=True,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=2,
    )


def _gpufeed(cfg: dict[str, Any]) -> Any:
    from gpufeed.data.augment import Augment
    from gpufeed.data.loader import Loader

    return Loader(
        cfg["shards"],
        cfg["batch_size"],
        num_workers=cfg["workers"],
        preprocess=cfg["preprocess"],
        decoder=cfg.get("decoder", "auto"),
        device=cfg["device"],
        augment=Augment.load_factor(cfg["load"], size=(cfg["size"], cfg["size"])),
        channels_last=True,
        drop_last=True,
    )


def _dali(cfg: dict[str, Any]) -> Any:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=cfg["batch_size"], num_threads=cfg["workers"], device_id=0)
    def pipe():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.file(file_root=cfg["images"], random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(
            jpegs,
            device="mixed",
            output_type=types.RGB,
            random_area=[0.08, 1.0],
            random_aspect_ratio=[0.75, 4 / 3],
        )
        images = fn.resize(images, resize_x=cfg["size"], resize_y=cfg["size"])
        for _ in range(cfg["load"]):
            images = fn.flip(
                images, horizontal=fn.random.coin_flip(), vertical=fn.random.coin_flip()
            )
            images = fn.rotate(images, angle=fn.random.uniform(range=(-15.0, 15.0)), keep_size=True)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="HWC",
            mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD],
        )
        return images, labels.gpu()

    p = pipe()
    p.build()
    it = DALIGenericIterator(
        p,
        ["images", "labels"],
        reader_name="Reader",
        last_batch_policy=LastBatchPolicy.DROP,
        auto_reset=True,
    )

    class Batches:
        def __iter__(self):  # type: ignore[no-untyped-def]
            for out in it:
                x = out[0]["images"].permute(0, 3, 1, 2)  # NHWC memory = channels_last NCHW
                yield x, out[0]["labels"].view(-1).long()

    return Batches()


class _Synthetic:
    def __init__(self, batch_size: int, steps: int, device: str, size: int) -> None:
        import torch

        self.x = torch.randn(batch_size, 3, size, size, device=device).contiguous(
            memory_format=torch.channels_last
        )
        self.y = torch.randint(0, 1000, (batch_size,), device=device)
        self.steps = steps

    def __iter__(self):  # type: ignore[no-untyped-def]
        for _ in range(self.steps):
            yield self.x, self.y


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from gpufeed.train.resnet import resnet

    torch.backends.cudnn.benchmark = True
    dev = torch.device(cfg["device"])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    sampler = GpuSampler()
    model = None
    if not cfg.get("loader_only"):
        model = resnet(cfg["model"], 1000).to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)

        def step(x: Any, y: Any) -> None:
            # bf16 on CUDA; float32 on a CPU (--smoke), where bf16 is emulated and very slow
            with torch.autocast("cuda", torch.bfloat16, enabled=dev.type == "cuda"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    sync()
    t_build = time.perf_counter()
    kind = cfg["kind"]
    steps = cfg["images_n"] // cfg["batch_size"]
    loader = {
        "synthetic": lambda c: _Synthetic(c["batch_size"], steps, c["device"], c["size"]),
        "classic": _classic,
        "gpufeed": _gpufeed,
        "dali": _dali,
    }[kind](cfg)
    build_s = time.perf_counter() - t_build
    epochs = []
    for epoch in range(cfg["epochs"]):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        sampler.active = epoch > 0
        t0 = time.perf_counter()
        waits, n = [], 0
        it = iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            if kind == "classic":
                x = x.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
                y = y.to(dev, non_blocking=True)
            waits.append(time.perf_counter() - w0)
            if model is not None:
                step(x, y)
            n += len(y)
        sync()
        sampler.active = False
        epochs.append(
            {
                "seconds": time.perf_counter() - t0,
                "images": n,
                "wait": sum(waits),
                "first_wait": waits[0] if waits else None,
                "batches": len(waits),
            }
        )
    steady = epochs[1:] or epochs
    rate = sum(e["images"] for e in steady) / sum(e["seconds"] for e in steady)
    out = {
        "rate": rate,
        "first_epoch_s": build_s + epochs[0]["seconds"],
        "first_waits_ms": [1e3 * e["first_wait"] for e in epochs if e["first_wait"] is not None],
        "wait_share": sum(e["wait"] for e in steady) / sum(e["seconds"] for e in steady),
        "gpu_util": sampler.mean(),
        "epochs": epochs,
    }
    if kind == "gpufeed":
        st = loader.stats()
        keys = ("decoder", "pinned", "prefetch", "num_workers", "stage_seconds", "batches")
        out["stats"] = {k: st[k] for k in keys}
        loader.close()
    return out


# --- the whole comparison ---------------------------------------------------------------------


def run_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(cfg)]
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_s"] = time.time() - t
            return res
    return {"error": (p.stderr or p.stdout)[-1500:]}


def pipelines(full: Path, small: Path, loads: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """(name, config) of every run: `needs` lists what a row cannot run without."""
    gpufeed = {"kind": "gpufeed", "shards": str(full)}
    runs: list[tuple[str, dict[str, Any]]] = [("synthetic", {"kind": "synthetic", "load": 0})]
    for load in loads:
        runs += [
            (f"classic torchvision L={load}", {"kind": "classic", "load": load, "needs": ["cuda"]}),
            (f"gpufeed CPU full-size L={load}", {**gpufeed, "load": load, "preprocess": "cpu"}),
            (
                f"gpufeed CPU resized-256 L={load}",
                {**gpufeed, "load": load, "shards": str(small), "preprocess": "cpu"},
            ),
            (
                f"gpufeed GPU (nvJPEG) L={load}",
                {
                    **gpufeed,
                    "load": load,
                    "preprocess": "gpu",
                    "decoder": "nvjpeg",
                    "needs": ["cuda"],
                },
            ),
            (
                f"gpufeed GPU (DALI decode) L={load}",
                {
                    **gpufeed,
                    "load": load,
                    "preprocess": "gpu",
                    "decoder": "dali",
                    "needs": ["dali"],
                },
            ),
            (
                f"gpufeed GPU (nvImageCodec decode) L={load}",
                {
                    **gpufeed,
                    "load": load,
                    "preprocess": "gpu",
                    "decoder": "nvimgcodec",
                    "needs": ["cuda", "nvimgcodec"],
                },
            ),
            (
                f"gpufeed GPU (workers decode) L={load}",
                {**gpufeed, "load": load, "preprocess": "gpu", "decoder": "workers"},
            ),
            (
                f"gpufeed GPU (workers decode) resized-256 L={load}",
                {
                    **gpufeed,
                    "load": load,
                    "shards": str(small),
                    "preprocess": "gpu",
                    "decoder": "workers",
                },
            ),
            (f"DALI L={load}", {"kind": "dali", "load": load, "needs": ["cuda", "dali"]}),
        ]
    alone = {**gpufeed, "load": 1, "loader_only": True}
    runs += [
        ("loader alone: gpufeed CPU full-size L=1", {**alone, "preprocess": "cpu"}),
        (
            "loader alone: gpufeed CPU resized-256 L=1",
            {**alone, "shards": str(small), "preprocess": "cpu"},
        ),
        (
            "loader alone: gpufeed GPU (nvJPEG) L=1",
            {**alone, "preprocess": "gpu", "decoder": "nvjpeg", "needs": ["cuda"]},
        ),
        (
            "loader alone: gpufeed GPU (DALI decode) L=1",
            {**alone, "preprocess": "gpu", "decoder": "dali", "needs": ["dali"]},
        ),
        (
            "loader alone: gpufeed GPU (nvImageCodec decode) L=1",
            {
                **alone,
                "preprocess": "gpu",
                "decoder": "nvimgcodec",
                "needs": ["cuda", "nvimgcodec"],
            },
        ),
    ]
    return runs


SMOKE_CPU = ("synthetic", "DALI decode", "workers decode")  # the rows --smoke runs on a CPU


def skip_reason(cfg: dict[str, Any], have: dict[str, bool]) -> str | None:
    """Why this machine (`have`: cuda, dali, nvimgcodec) cannot run `cfg`'s row, or None."""
    missing = [n for n in cfg.get("needs", []) if not have[n]]
    if not missing:
        return None
    what = {
        "cuda": "a CUDA GPU",
        "dali": 'NVIDIA DALI (pip install "gpufeed[dali]")',
        "nvimgcodec": 'nvImageCodec (pip install "gpufeed[nvimgcodec]")',
    }
    return "needs " + " and ".join(what[n] for n in missing)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--quality", type=int, default=80)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--loads", type=int, nargs="+", default=[1, 12])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--only", nargs="*", default=None, help="run only these pipeline names")
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/gpu-bench"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--size", type=int, default=224, help="image side the model sees")
    ap.add_argument("--smoke", action="store_true", help="a small, quick run (also on CPU)")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    import torch

    from gpufeed.data.dali import dali_importable
    from gpufeed.extras import installed

    cuda = torch.cuda.is_available()
    have = {
        "cuda": cuda,
        "dali": dali_importable(),
        "nvimgcodec": installed("nvimgcodec"),  # find_spec raises without an nvidia package
    }
    if args.smoke:
        args.images, args.batch_size, args.loads, args.epochs = 32, 8, [1], 2
        args.model, args.workers, args.size = "resnet18", min(args.workers, 2), 64
    elif not cuda:
        sys.exit(
            "gpu_feed.py needs a CUDA GPU (--smoke runs a small version on the CPU; the CPU "
            "benchmark is benchmarks/feed_efficiency.py)"
        )
    names = [name for name, _ in pipelines(Path(), Path(), args.loads)]
    if args.only and not any(o in name for o in args.only for name in names):
        sys.exit(f"--only {' '.join(args.only)}: no pipeline name contains it; the names: "
                 + "; ".join(names))  # fmt: skip
    t0 = time.time()
    root, full, small = make_data(args.cache, args.images, args.quality)
    sizes = [p.stat().st_size for p in root.glob("*/*.jpg")]
    print(
        f"data: {len(sizes)} JPEGs, mean {sum(sizes) / len(sizes) / 1024:.0f} KiB "
        f"({time.time() - t0:.0f} s incl. packing)",
        flush=True,
    )
    base = {
        "batch_size": args.batch_size,
        "workers": args.workers,
        "epochs": args.epochs,
        "model": args.model,
        "images": str(root),
        "images_n": args.images,
        "device": "cuda" if cuda else "cpu",
        "size": args.size,
    }
    runs = pipelines(full, small, args.loads)
    if args.only:
        runs = [r for r in runs if any(o in r[0] for o in args.only)]
    results: dict[str, Any] = {}
    earlier = args.out / "results.json" if args.out else None
    if args.only and earlier and earlier.exists():  # a later call adds its rows to the earlier
        results = json.loads(earlier.read_text())
        print(f"adding to the {len(results)} rows in {earlier}", flush=True)
    for name, extra in runs:
        why = skip_reason(extra, have)
        if not why and args.smoke and not cuda and not any(k in name for k in SMOKE_CPU):
            why = "not in --smoke without CUDA"
        if why:
            print(f"{name}: skipped, {why}", flush=True)
            results[name] = {"skipped": why}
            continue
        res = run_child({**base, **extra}, args.timeout)
        results[name] = res
        if args.out:  # as it goes: a run cut short still leaves what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "results.json").write_text(json.dumps(results, indent=1))
        if "error" in res:
            print(f"{name}: FAILED {res['error']}", flush=True)
        else:
            print(
                f"{name}: {res['rate']:.0f} img/s, first epoch {res['first_epoch_s']:.1f} s, "
                f"first waits {[round(w) for w in res['first_waits_ms']]} ms, "
                f"GPU util {res['gpu_util']}, {res.get('stats', '')}",
                flush=True,
            )
    ceiling = results.get("synthetic", {}).get("rate")
    device = torch.cuda.get_device_name(0) if cuda else "no GPU (CPU run)"
    lines = [
        f"# GPU feed benchmark ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Device: {device}, {os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}); "
        f"torch {torch.__version__}. Model {args.model} on {args.size}×{args.size}, "
        f"{'bf16 autocast' if cuda else 'float32'}, channels_last, SGD, batch "
        f"{args.batch_size}, {args.workers} loader workers, {args.epochs} epochs of "
        f"{args.images} photo-like JPEGs (mean {sum(sizes) / len(sizes) / 1024:.0f} KiB, short "
        "side 300-500); each pipeline in a fresh process. img/s = epochs 2.. (steady); "
        "first epoch = pipeline start + epoch 0 (cuDNN autotuning included).",
        "",
        "| pipeline | img/s | share of ceiling | GPU util % | first-batch wait per epoch (ms) "
        "| first epoch (s) | data wait share |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        if "skipped" in res or "error" in res:
            status = f"skipped: {res['skipped']}" if "skipped" in res else "failed"
            lines.append(f"| {name} | {status} | | | | | |")
            continue
        share = f"{res['rate'] / ceiling:.3f}" if ceiling else ""
        util = f"{res['gpu_util']:.0f}" if res.get("gpu_util") is not None else ""
        waits = ", ".join(f"{w:.0f}" for w in res["first_waits_ms"])
        lines.append(
            f"| {name} | {res['rate']:.0f} | {share} | {util} | {waits} "
            f"| {res['first_epoch_s']:.1f} | {res['wait_share']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(text)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
