"""Train a ResNet the way a performance-minded user would, with gpufeed's loader and training pieces.

    python examples/train_resnet.py --synthetic --model resnet50 --amp bf16 --channels-last --steps 50
    python examples/train_resnet.py --data path/to/image_folder --batch-size 64 --workers 7
    gpufeed profile -- python examples/train_resnet.py --data shards/ --steps 200
    torchrun --nproc_per_node 2 examples/train_resnet.py --data shards/

``--data`` takes gpufeed shards (a directory or s3:// URL holding gpufeed-index.json) or an image folder
(``class/image.jpg``), which is packed into shards once, under ``--pack-dir``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch.distributed

from gpufeed.data import Augment, Loader, has_index, pack
from gpufeed.train import (
    MODELS,
    DistInfo,
    SyntheticData,
    cleanup_distributed,
    fit,
    resnet,
    setup_distributed,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--data", help="shards (dir or s3:// URL with gpufeed-index.json) or an image folder"
    )
    src.add_argument(
        "--synthetic", action="store_true", help="one resident random batch: the model-only ceiling"
    )
    p.add_argument("--model", default="resnet50", choices=MODELS)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="default: the data's classes (1000 if synthetic)",
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--amp", choices=["bf16", "fp16"], default=None, help="mixed precision")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="loader worker processes (default: every core but one, per local rank)",
    )
    p.add_argument("--preprocess", choices=["cpu", "gpu", "auto"], default="cpu")
    p.add_argument(
        "--load",
        type=int,
        default=None,
        help="augmentation load factor: (flip, flip, rotate) × L (default: the ImageNet recipe)",
    )
    p.add_argument(
        "--pack-dir", default=".gpufeed-cache/shards", help="where an image folder is packed"
    )
    return p.parse_args(argv)


def make_loader(args: argparse.Namespace, dist: DistInfo) -> Loader:
    size = (args.image_size, args.image_size)
    data = args.data
    if "://" not in data and not has_index(data):
        if not Path(data).is_dir():
            sys.exit(
                f"train_resnet.py: --data {data}: no such directory (want shards or an image folder)"
            )
        shards = Path(args.pack_dir) / Path(data).resolve().name
        if dist.local_rank == 0:  # one packer per machine; the other ranks wait for it
            print(pack(data, shards).summary(), file=sys.stderr)
        if dist.world_size > 1:
            torch.distributed.barrier()
        data = str(shards)
    return Loader(
        data,
        args.batch_size,
        num_workers=args.workers,
        preprocess=args.preprocess,
        device=dist.device,
        augment=Augment(size=size)
        if args.load is None
        else Augment.load_factor(args.load, size=size),
        channels_last=args.channels_last,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist = setup_distributed()
    if args.synthetic:
        classes = args.num_classes or 1000
        data = SyntheticData(args.batch_size, args.image_size, classes, steps=args.steps or 100)
    else:
        data = make_loader(args, dist)
        classes = args.num_classes or len(data.dataset.classes)
    model = resnet(args.model, num_classes=classes)
    result = fit(
        model,
        data,
        epochs=args.epochs,
        steps=args.steps,
        optimizer=args.optimizer,
        lr=args.lr,
        amp=args.amp,
        channels_last=args.channels_last,
        compile=args.compile,
        device=dist.device,
    )
    if dist.is_main:
        print(f"{args.model}: {result.total_images_per_s:.1f} images/s over {result.steps} steps")
    cleanup_distributed()


if __name__ == "__main__":
    main()
