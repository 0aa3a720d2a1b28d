"""A plain training script for the demo: a ResNet on an image folder (naive pipeline) or on shards
(gpufeed loader). It knows nothing of the profiler; `gpufeed demo` runs it under `gpufeed profile`.

    python -m gpufeed.demo.train --pipeline naive --data IMAGES --steps 40 --result r.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpufeed.devices import default_device

PIPELINES = ("naive", "gpufeed")


class _Announced:
    """Wraps a loader and prints `step N` to stdout as each batch is handed out (the demo's
    progress bar reads these lines); `set_epoch` is passed through."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.count = loader, 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.count += 1
            print(f"step {self.count}", flush=True)
            yield batch


def build_loader(args: argparse.Namespace) -> Any:
    """The naive DataLoader over the image folder, or the gpufeed Loader over the shards."""
    from gpufeed.data.augment import Augment

    # one recipe for both pipelines, so they do the same work
    recipe = Augment.load_factor(1, size=(args.image_size, args.image_size))
    if args.pipeline == "naive":
        from gpufeed.advise.naive import naive_loader

        return naive_loader(args.data, args.batch_size, args.workers, recipe)
    from gpufeed.data.loader import Loader

    return Loader(
        args.data,
        args.batch_size,
        num_workers=args.workers,
        prefetch=args.prefetch,
        preprocess=args.preprocess,
        augment=recipe,
        drop_last=True,  # as the naive loader: the same whole batches (a batch of 1 breaks BN)
    )


def main(argv: list[str] | None = None) -> int:
    """Train `--steps` steps and write the measured throughput to `--result` (JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", choices=PIPELINES, required=True)
    ap.add_argument("--data", required=True, help="image folder (naive) or shard directory")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--preprocess", default="auto", help="gpufeed pipeline: cpu, gpu or auto")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads when training on CPU (default 1: the model stands in for an "
        "accelerator on one core and leaves the other cores to the input pipeline)",
    )
    ap.add_argument("--result", help="write the measured figures here as JSON")
    args = ap.parse_args(argv)

    import torch

    from gpufeed.train.loop import fit
    from gpufeed.train.resnet import resnet

    torch.manual_seed(0)
    loader = build_loader(args)
    classes = loader.dataset.classes
    model = resnet(args.model, num_classes=max(2, len(classes)))
    device = default_device()
    if device == "cpu":
        torch.set_num_threads(args.threads)
    amp = "bf16" if device == "cuda" else None
    try:
        result = fit(
            model,
            _Announced(loader),
            epochs=10_000,
            steps=args.steps,
            device=device,
            amp=amp,
            channels_last=device == "cuda",
            log_every=0,
            verbose=False,
        )
    finally:
        close = getattr(loader, "close", None)  # gpufeed's Loader: its feeder and workers
        if callable(close):
            close()
    figures = {
        "pipeline": args.pipeline,
        "model": args.model,
        "device": device,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "workers": args.workers,
        "threads": torch.get_num_threads(),
        "steps": result.steps,
        "measured_steps": result.measured_steps,
        "seconds": result.seconds,
        "images_per_s": result.images_per_s,
        "data_wait_fraction": result.data_wait_fraction,
    }
    if args.pipeline == "gpufeed":
        figures["preprocess"] = loader.preprocess
    if args.result:
        Path(args.result).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
