"""What sizes `gpufeed demo` and what it may write: `DemoConfig` and its options checked
(`demo_config`), the demo's errors, and its work dir claimed (`claim_work_dir`) before anything
is written there."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from gpufeed.errors import GpufeedError

DEFAULT_WORK_DIR = "gpufeed-demo"


class DemoError(GpufeedError, RuntimeError):
    """A demo step failed; the message says which and where its log is."""


class DemoOptionError(DemoError, ValueError):
    """A demo option out of range; the message names the option and what to give."""


@dataclass(frozen=True)
class DemoConfig:
    """Everything that sizes the demo. Both training runs share model, batch, image size and steps."""

    images: int = 1200
    classes: int = 10
    short_side: tuple[int, int] = (300, 500)
    steps: int = 100
    batch_size: int = 64
    image_size: int = 32  # CPU-only; 224 where CUDA exists (see `demo_config`)
    model: str = "resnet18"
    naive_workers: int = 0  # PyTorch's default: the training process decodes every batch itself
    workers: int | None = None  # gpufeed loader workers; default: the cores the model leaves free

    @property
    def pack_resize(self) -> int:
        """Short side the shards are pre-resized to: a little above the training size, so that
        random-resized crops keep their detail (like 256 for 224)."""
        return max(8, math.ceil(self.image_size * 1.25))

    def loader_workers(self) -> int:
        from gpufeed.cores import usable_cores

        return self.workers if self.workers is not None else max(1, usable_cores() - 1)


# CI's run: few images, and training images small enough that the model (on one CPU core) is
# clearly faster than full-size Pillow decoding, as an accelerator would be.
TINY = DemoConfig(
    images=512, classes=4, short_side=(300, 400), steps=30, batch_size=128, image_size=16
)
GPU_IMAGE_SIZE = 224


def demo_config(
    tiny: bool = False,
    images: int | None = None,
    steps: int | None = None,
    model: str | None = None,
    batch_size: int | None = None,
    image_size: int | None = None,
) -> DemoConfig:
    """The default (or `--tiny`) configuration with the given options applied; DemoOptionError (a
    ValueError) on bad ones."""
    import torch

    from gpufeed.advise.measure import check_batch_memory
    from gpufeed.train.resnet import MODELS

    cfg = TINY if tiny else DemoConfig()
    if torch.cuda.is_available() and image_size is None:
        cfg = replace(cfg, image_size=GPU_IMAGE_SIZE, batch_size=max(64, cfg.batch_size))
    changes = {
        k: v
        for k, v in {
            "images": images,
            "steps": steps,
            "model": model,
            "batch_size": batch_size,
            "image_size": image_size,
        }.items()
        if v is not None
    }
    cfg = replace(cfg, **changes)
    if cfg.model not in MODELS:
        raise DemoOptionError(
            f"--model {cfg.model!r} is not known: choose one of {', '.join(MODELS)}"
        )
    for name, least in (
        ("images", cfg.classes),
        ("steps", 8),
        ("batch_size", 2),  # BatchNorm cannot train on one image per batch
        ("image_size", 16),
    ):
        if getattr(cfg, name) < least:
            flag = "--" + name.replace("_", "-")
            raise DemoOptionError(f"{flag} must be at least {least}, got {getattr(cfg, name)}")
    if cfg.images < 2 * cfg.batch_size:
        raise DemoOptionError(
            f"--images {cfg.images} is too few for --batch-size {cfg.batch_size}: "
            "give at least two batches of images"
        )
    check_batch_memory(cfg.batch_size, cfg.image_size)  # before a run thrashes and is killed
    return cfg


WORK_MARKER = ".gpufeed-demo"  # in a work dir the demo made
_DEMO_ENTRIES = {"data", "logs", "runs", "demo-result.json", WORK_MARKER}


def claim_work_dir(work: Path) -> None:
    """Create the work dir `work` and mark it as the demo's, or refuse (DemoOptionError) a folder
    holding files the demo does not make: it rewrites logs/, runs/ and demo-result.json there. A
    folder a demo ran in before the marker existed is known by its layout."""
    from gpufeed.data.packing import printable

    if work.is_dir() and not (work / WORK_MARKER).is_file():
        names = {p.name for p in work.iterdir()}
        made = "demo-result.json" in names or any((work / "data").glob("images-*"))
        if names and not (names <= _DEMO_ENTRIES and made):
            raise DemoOptionError(
                f"--out {printable(str(work))} holds files gpufeed demo does not make: give an "
                "empty or new folder, or a former demo work dir"
            )
    try:
        work.mkdir(parents=True, exist_ok=True)
        marker = work / WORK_MARKER
        if not marker.is_file():
            marker.write_text("made by `gpufeed demo`: its data, logs and runs are kept here\n")
    except OSError as e:
        raise DemoError(
            f"cannot create the work dir {work}: {e.strerror or e}; use --out DIR"
        ) from None
