"""The naive baseline pipeline: ImageFolder layout, Pillow decode, per-image augmentation by the
very `Augment` the gpufeed loader is given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gpufeed.advise.naive import NaiveImageFolder, naive_loader
from gpufeed.data.augment import Augment
from gpufeed.demo.synth import make_image_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("nf"), 12, 3, short_side=(60, 90))


def test_items_are_normalized_crops_labelled_by_class_folder(folder: Path):
    ds = NaiveImageFolder(folder, Augment.load_factor(1, size=(24, 24)))
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
    flat = Augment(size=(8, 8), load=0)  # a flat image stays flat
    x, _ = NaiveImageFolder(tmp_path, flat)[0]
    want = [
        (v / 255 - m) / s
        for v, m, s in zip((200, 100, 20), IMAGENET_MEAN, IMAGENET_STD, strict=True)
    ]
    assert torch.allclose(x, torch.tensor(want).view(3, 1, 1).expand(3, 8, 8), atol=1e-6)


@pytest.fixture
def noise(tmp_path: Path) -> Path:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (48, 48, 3), dtype=np.uint8)
    (tmp_path / "c").mkdir()
    Image.fromarray(pixels).save(tmp_path / "c" / "noise.png")
    return tmp_path


def test_the_augment_is_the_recipe_its_parameters_change_what_is_done(noise: Path):
    from PIL import Image

    # no rotation, no flips, the whole image as the crop: plain resize, the same every time
    plain = Augment(size=(16, 16), scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0, degrees=0.0,
                    mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # fmt: skip
    ds = NaiveImageFolder(noise, plain)
    with Image.open(noise / "c" / "noise.png") as im:
        resized = np.array(im.convert("RGB").resize((16, 16), Image.Resampling.BILINEAR))
    want = torch.from_numpy(resized).permute(2, 0, 1).float() / 255
    assert torch.equal(ds[0][0], ds[0][0]) and torch.allclose(ds[0][0], want, atol=1e-6)
    # the seed experiments' recipe draws crops, flips and rotations: items differ
    heavy = NaiveImageFolder(noise, Augment.load_factor(1, size=(16, 16)))
    assert not torch.equal(heavy[0][0], heavy[0][0])
    # mean and std are the Augment's
    shifted = NaiveImageFolder(noise, Augment(**{**vars(plain), "mean": (0.5, 0.5, 0.5)}))
    assert torch.allclose(shifted[0][0], want - 0.5, atol=1e-6)


def test_a_user_transform_is_refused_not_skipped(noise: Path):
    with pytest.raises(ValueError, match=r"not Augment\.transform"):
        NaiveImageFolder(noise, Augment(transform=lambda batch: batch))


def test_loader_batches_with_a_worker_process(folder: Path):
    loader = naive_loader(folder, batch_size=4, num_workers=1, augment=Augment(size=(16, 16)))
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 16, 16) and labels.shape == (4,)


def test_a_missing_or_empty_folder_is_refused_by_name(tmp_path: Path):
    with pytest.raises(ValueError, match="does not exist"):
        naive_loader(tmp_path / "nope", 4)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images found"):
        NaiveImageFolder(tmp_path / "empty")


def test_fewer_images_than_one_batch_is_refused_with_the_counts(folder: Path):
    with pytest.raises(ValueError, match=r"has 12 images, fewer than one batch of 16: lower"):
        naive_loader(folder, batch_size=16)


def test_only_image_files_are_items_as_in_imagefolder(tmp_path: Path):
    root = make_image_folder(tmp_path / "imgs", 4, 2, short_side=(40, 60))
    (root / "class_000" / "README.txt").write_text("not an image")
    (root / "class_001" / "labels.csv").write_text("a,b\n")
    ds = NaiveImageFolder(root)
    assert len(ds) == 4 and all(p.endswith(".jpg") for p, _ in ds.items)


def test_an_unreadable_image_is_an_error_naming_the_file_and_the_fix(tmp_path: Path):
    root = make_image_folder(tmp_path / "imgs", 2, 1, short_side=(40, 60))
    bad = sorted(root.glob("*/*.jpg"))[0]
    bad.write_bytes(b"\xff\xd8 cut short")
    ds = NaiveImageFolder(root, Augment(size=(16, 16)))
    i = [p for p, _ in ds.items].index(str(bad))
    with pytest.raises(ValueError, match=r"not a readable image \(UnidentifiedImageError\)") as e:
        ds[i]
    assert str(e.value).startswith(f"{bad}: ") and f"gpufeed pack {root} DST" in str(e.value)


def test_a_list_file_is_read_whole_whatever_its_names_end_with(tmp_path: Path):
    root = make_image_folder(tmp_path / "imgs", 2, 1, short_side=(40, 60))
    renamed = []
    for i, p in enumerate(sorted(root.glob("*/*.jpg"))):
        renamed.append(p.rename(p.with_name(f"photo{i}")))
    (tmp_path / "list.txt").write_text("".join(f"{p} 0\n" for p in renamed))
    assert [p for p, _ in NaiveImageFolder(tmp_path / "list.txt").items] == [
        str(p) for p in renamed
    ]
