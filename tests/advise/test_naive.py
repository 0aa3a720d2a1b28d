"""The naive baseline pipeline: ImageFolder layout, Pillow decode, per-image augmentation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpufeed.advise.naive import NaiveImageFolder, naive_loader
from gpufeed.demo.synth import make_image_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("nf"), 12, 3, short_side=(60, 90))


def test_items_are_normalized_crops_labelled_by_class_folder(folder: Path):
    ds = NaiveImageFolder(folder, image_size=24)
    assert len(ds) == 12 and ds.classes == ["class_000", "class_001", "class_002"]
    x, label = ds[4]
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32
    assert label == ds.classes.index(Path(ds.items[4][0]).parent.name)
    assert -3 < float(x.mean()) < 3 and float(x.std()) > 0.05


def test_normalization_is_torchvisions_to_tensor_then_normalize(tmp_path: Path):
    from PIL import Image

    from gpufeed.data.augment import IMAGENET_MEAN, IMAGENET_STD

    (tmp_path / "c").mkdir()
    Image.new("RGB", (40, 30), (200, 100, 20)).save(tmp_path / "c" / "flat.png")
    x, _ = NaiveImageFolder(tmp_path, image_size=8, load=0)[0]  # a flat image stays flat
    want = [
        (v / 255 - m) / s
        for v, m, s in zip((200, 100, 20), IMAGENET_MEAN, IMAGENET_STD, strict=True)
    ]
    assert torch.allclose(x, torch.tensor(want).view(3, 1, 1).expand(3, 8, 8), atol=1e-6)


def test_loader_batches_with_a_worker_process(folder: Path):
    images, labels = next(iter(naive_loader(folder, batch_size=4, num_workers=1, image_size=16)))
    assert images.shape == (4, 3, 16, 16) and labels.shape == (4,)


def test_a_missing_or_empty_folder_is_refused_by_name(tmp_path: Path):
    with pytest.raises(ValueError, match="does not exist"):
        naive_loader(tmp_path / "nope", 4)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images found"):
        NaiveImageFolder(tmp_path / "empty")
