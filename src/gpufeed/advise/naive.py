"""The classic input pipeline gpufeed is measured against: an ImageFolder-style Dataset that opens
and fully decodes every JPEG with Pillow, then augments it one image at a time in Pillow (random
resized crop, flips, rotation, to-tensor, normalize), behind a plain PyTorch DataLoader.

It applies the same augmentations as `gpufeed.data.augment.Augment` at load factor L, so a
comparison against the gpufeed loader differs only in how the work is done.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.data.augment import IMAGENET_MEAN, IMAGENET_STD

if TYPE_CHECKING:
    import torch
    from PIL import Image


class NaiveImageFolder:
    """`root/<class>/<image>` (or a list file) as (3×S×S float tensor, label) items, decoded per item.

    A map-style dataset (torch's DataLoader needs only `__len__` and `__getitem__`).
    """

    def __init__(self, root: str | os.PathLike[str], image_size: int = 224, load: int = 1) -> None:
        from gpufeed.data.packing import PackError, list_inputs

        try:
            items, classes, _ = list_inputs(root)
        except PackError as e:
            raise ValueError(str(e)) from None
        self.items = [(it.path, it.label) for it in items]
        if not self.items:
            raise ValueError(f"no images found in {root}: expected ROOT/<class>/<image> files")
        self.classes = classes
        self.image_size = image_size
        self.load = load
        self.mean = np.array(IMAGENET_MEAN, np.float32).reshape(3, 1, 1)
        self.std = np.array(IMAGENET_STD, np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        import torch
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            img = im.convert("RGB")  # full-size decode, every time
        img = _random_resized_crop(img, self.image_size)
        for _ in range(self.load):
            if random.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            if random.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
            img = img.rotate(random.uniform(-15.0, 15.0), resample=Image.Resampling.BILINEAR)
        # torchvision's ToTensor then Normalize, op for op
        x = torch.from_numpy(np.array(img, np.uint8)).permute(2, 0, 1).contiguous()
        x = x.to(torch.float32).div(255)
        return x.sub_(torch.from_numpy(self.mean)).div_(torch.from_numpy(self.std)), label


def _random_resized_crop(img: Image.Image, size: int) -> Image.Image:
    """torchvision's RandomResizedCrop((size, size), scale=(0.08, 1), ratio=(3/4, 4/3)), bilinear."""
    from PIL import Image

    w, h = img.size
    area = w * h
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = random.randint(0, w - cw), random.randint(0, h - ch)
            break
    else:
        cw, ch = min(w, h), min(w, h)
        x, y = (w - cw) // 2, (h - ch) // 2
    return img.resize((size, size), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))


def naive_loader(
    root: str | os.PathLike[str],
    batch_size: int,
    num_workers: int = 1,
    image_size: int = 224,
    load: int = 1,
    **dataloader_options: Any,
) -> torch.utils.data.DataLoader:
    """The classic `DataLoader(ImageFolder(root, transform), shuffle=True)` with too few workers."""
    import torch.utils.data

    if not Path(root).exists():
        raise ValueError(f"image folder {root} does not exist")
    dataset = NaiveImageFolder(root, image_size=image_size, load=load)
    return torch.utils.data.DataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        drop_last=True,
        persistent_workers=num_workers > 0,
        **dataloader_options,
    )
