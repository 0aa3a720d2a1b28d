"""The classic input pipeline gpufeed is measured against: an ImageFolder-style Dataset that opens
and fully decodes every JPEG with Pillow, then augments it one image at a time in Pillow (random
resized crop, flips, rotation, to-tensor, normalize), behind a plain PyTorch DataLoader.

Its recipe IS a `gpufeed.data.augment.Augment` (output size, crop scale and ratio, flip
probabilities, rotation degrees, load factor, mean/std, eval crop), so a comparison against the
gpufeed loader given the same Augment differs only in how the work is done.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.data.augment import Augment
from gpufeed.text import count

if TYPE_CHECKING:
    import torch


class NaiveImageFolder:
    """`root/<class>/<image>` (or a list file) as (3×H×W float tensor, label) items, decoded per
    item and augmented by `augment` (default: `Augment.load_factor(1)`, the seed experiments').

    A map-style dataset (torch's DataLoader needs only `__len__` and `__getitem__`). Like
    ImageFolder it reads only the image files of a folder (by extension: `IMAGE_SUFFIXES`, as
    `gpufeed pack` counts them) and stops at the first one it cannot decode, but with an error that
    names the file and the fix.
    """

    def __init__(self, root: str | os.PathLike[str], augment: Augment | None = None) -> None:
        from gpufeed.data.listing import IMAGE_SUFFIXES, list_inputs
        from gpufeed.data.pack_errors import PackError

        self.augment = Augment.load_factor(1) if augment is None else augment
        if self.augment.transform is not None:
            raise ValueError(
                "the naive baseline applies Augment's crop, flips, rotation and normalization, "
                "not Augment.transform: compare without a transform"
            )
        try:
            items, classes, _ = list_inputs(root)
        except PackError as e:
            raise ValueError(str(e)) from None
        self.root = str(root)
        folder = Path(root).is_dir()  # a list file names its images: all of them are read
        self.items = [
            (it.path, it.label)
            for it in items
            if not folder or Path(it.path).suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.items:
            raise ValueError(f"no images found in {root}: expected ROOT/<class>/<image> files")
        self.classes = classes
        self.mean = np.array(self.augment.mean, np.float32).reshape(3, 1, 1)
        self.std = np.array(self.augment.std, np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        import torch
        from PIL import Image

        aug = self.augment
        path, label = self.items[i]
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")  # full-size decode, every time
        except OSError as e:  # PIL.UnidentifiedImageError, a truncated file, a vanished one
            why = type(e).__name__ if path in str(e) else f"{type(e).__name__}: {e}"
            raise ValueError(
                f"{path}: not a readable image ({why}); remove or replace it "
                f"(`gpufeed pack {self.root} DST` leaves out and lists every unreadable file)"
            ) from None
        out_h, out_w = aug.size
        top, left, h, w = self._box(img.height, img.width)
        img = img.resize(
            (out_w, out_h), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h)
        )
        for _ in range(aug.load if aug.train else 0):
            if random.random() < aug.hflip:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            if random.random() < aug.vflip:
                img = img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
            if aug.degrees:
                angle = random.uniform(-aug.degrees, aug.degrees)
                img = img.rotate(angle, resample=Image.Resampling.BILINEAR)
        # torchvision's ToTensor then Normalize, op for op
        x = torch.from_numpy(np.array(img, np.uint8)).permute(2, 0, 1).contiguous()
        x = x.to(torch.float32).div(255)
        return x.sub_(torch.from_numpy(self.mean)).div_(torch.from_numpy(self.std)), label

    def _box(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) to crop: torchvision's RandomResizedCrop with the Augment's
        scale and ratio (10 tries, then a center square), or the Augment's own eval crop."""
        aug = self.augment
        if not aug.train:
            return aug.boxes([(h, w)], None)[0]  # type: ignore[arg-type]  # draws nothing
        for _ in range(10):
            target = h * w * random.uniform(*aug.scale)
            ratio = math.exp(random.uniform(math.log(aug.ratio[0]), math.log(aug.ratio[1])))
            cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
            if 0 < cw <= w and 0 < ch <= h:
                return random.randint(0, h - ch), random.randint(0, w - cw), ch, cw
        side = min(h, w)
        return (h - side) // 2, (w - side) // 2, side, side


def naive_loader(
    root: str | os.PathLike[str],
    batch_size: int,
    num_workers: int = 1,
    augment: Augment | None = None,
    **dataloader_options: Any,
) -> torch.utils.data.DataLoader:
    """The classic `DataLoader(ImageFolder(root, transform), shuffle=True)` with too few workers."""
    import torch.utils.data

    if not Path(root).exists():
        raise ValueError(f"image folder {root} does not exist")
    dataset = NaiveImageFolder(root, augment)
    if len(dataset) < batch_size:  # drop_last: not one batch
        raise ValueError(
            f"{root} has {count(len(dataset), 'image')}, fewer than one batch of {batch_size}: "
            "lower the batch size or add images"
        )
    return torch.utils.data.DataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        drop_last=True,
        persistent_workers=num_workers > 0,
        **dataloader_options,
    )
