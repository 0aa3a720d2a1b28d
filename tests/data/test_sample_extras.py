"""Loader(extras=...): each sample's key and members (json, txt, cls) beside its image.

The data: WebDataset shards written by webdataset.ShardWriter (members in sorted order, so `.cls`
before the image and `.json`, `.txt` after it) where sample i has key s000i, label i and members
naming i: every value must line up with the label and image of its batch position, on every
path (inline, worker processes with lent slots, GPU preprocessing on the CPU, workers decoding
for the device), across resumption and with corrupt samples left out; the images are those of
the same Loader without extras.
"""

from __future__ import annotations

import contextlib
import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from indexes import legacy_copy

from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.indexer import index_shards
from gpufeed.data.loader import Loader
from gpufeed.data.sample_extras import MissingMember
from gpufeed.data.shards import ShardError
from gpufeed.errors import OptionError

SMALL = Augment(size=(16, 16))
ALL = ("__key__", "json", "txt", "cls", "__url__")


def _write_wds(out: Path, image_folder: Path, lacking: int | None = None) -> Path:
    """48 samples in 4 WebDataset shards (13 a shard); sample `lacking` has no .json."""
    import webdataset as wds

    images = [p.read_bytes() for p in sorted(image_folder.glob("*/*.jpg"))]
    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "wds-%06d.tar"), maxcount=13, verbose=0) as sink:
        for i, data in enumerate(images):
            sample = {"__key__": f"s{i:04d}", "jpg": data, "cls": i, "txt": f"sample {i}"}
            if i != lacking:
                sample["json"] = {"id": i, "file": f"img{i}.jpg"}
            sink.write(sample)
    index_shards(str(out), progress=False)
    return out


@pytest.fixture(scope="module")
def wds_shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_wds(tmp_path_factory.mktemp("extras") / "wds", image_folder)


@pytest.fixture
def make() -> Iterator[Callable[..., Loader]]:
    """`make(data, batch_size, **options)`: a CPU Loader of 16×16 images, closed after the test."""
    with contextlib.ExitStack() as stack:

        def new(data: Path, batch_size: int, **kw: Any) -> Loader:
            kw = {"augment": SMALL, "device": "cpu", "seed": 3, **kw}
            return stack.enter_context(Loader(data, batch_size, **kw))

        yield new


def _check_aligned(labels: torch.Tensor, keys: list, jsons: list, txts: list, cls: list) -> None:
    """Every value names the sample whose label sits at its position."""
    ids = labels.tolist()
    assert keys == [f"s{i:04d}" for i in ids]
    assert jsons == [{"id": i, "file": f"img{i}.jpg"} for i in ids]
    assert txts == [f"sample {i}" for i in ids]
    assert cls == ids


PATHS = {
    "inline": {"num_workers": 0},
    "workers, lent slots": {"num_workers": 2},
    "workers, uint8": {"num_workers": 2, "dtype": torch.uint8},
    "gpu preprocess on cpu": {"num_workers": 2, "preprocess": "gpu"},
    "workers decode for the device": {"num_workers": 2, "preprocess": "gpu", "decoder": "workers"},
}


@pytest.mark.parametrize("options", PATHS.values(), ids=list(PATHS))
def test_keys_and_members_line_up_with_the_images_and_labels_on_every_path(
    wds_shards: Path, make: Callable[..., Loader], options: dict[str, Any]
):
    plain = [(x.clone(), y) for x, y in make(wds_shards, 5, **options)]
    loader = make(wds_shards, 5, extras=ALL, **options)
    if options["num_workers"] and "preprocess" not in options and "dtype" not in options:
        assert loader._lends()  # the CPU batches are the workers' slots, lent
    got = []
    for (x0, y0), (images, labels, keys, jsons, txts, cls, urls) in zip(plain, loader, strict=True):
        assert torch.equal(images, x0) and torch.equal(labels, y0)  # the same batches
        _check_aligned(labels, keys, jsons, txts, cls)
        assert all(Path(u).parent == wds_shards and u.endswith(".tar") for u in urls)
        got += keys
    assert sorted(got) == [f"s{i:04d}" for i in range(48)]  # each sample once


def test_a_resumed_epoch_delivers_the_rest_with_their_keys(
    wds_shards: Path, make: Callable[..., Loader]
):
    first = make(wds_shards, 5, num_workers=2, extras=("__key__", "json", "txt", "cls"))
    first.set_epoch(1)
    it = iter(first)
    seen = []
    for _ in range(3):
        _, labels, keys, jsons, txts, cls = next(it)
        _check_aligned(labels, keys, jsons, txts, cls)
        seen += keys
    state = first.state_dict()
    first.close()
    second = make(wds_shards, 5, num_workers=2, extras=("__key__", "json", "txt", "cls"))
    second.load_state_dict(state)
    rest = []
    for _, labels, keys, jsons, txts, cls in second:
        _check_aligned(labels, keys, jsons, txts, cls)
        rest += keys
    assert sorted(seen + rest) == [f"s{i:04d}" for i in range(48)]


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
def test_a_corrupt_sample_is_left_out_of_the_keys_as_of_the_images(
    corrupt_shards: Path, make: Callable[..., Loader], preprocess: str
):
    """10 good samples (label 0) and a truncated JPEG (label 1): its key goes with its image."""
    loader = make(
        corrupt_shards, 4, num_workers=2, preprocess=preprocess, extras=("__key__", "cls")
    )
    keys = []
    with pytest.warns(RuntimeWarning, match="left a corrupt sample out"):
        for images, labels, batch_keys, cls in loader:
            assert len(batch_keys) == len(labels) == images.shape[0]
            assert cls == labels.tolist() == [0] * len(labels)
            keys += batch_keys
    (bad,) = loader.stats()["corrupt_samples"]
    assert len(keys) == 10 and bad["key"] not in keys and bad["key"].endswith("_bad")


def test_shards_indexed_without_image_offsets_give_the_same_extras(
    wds_shards: Path, make: Callable[..., Loader], tmp_path: Path
):
    """A version-1 index without image offsets: samples are read member by member."""
    d = legacy_copy(wds_shards, tmp_path / "v1")
    extras = ("__key__", "json", "txt", "cls")
    got = [b for b in make(d, 5, num_workers=0, extras=extras)]
    want = [b for b in make(wds_shards, 5, num_workers=0, extras=extras)]
    assert [b[2:] for b in got] == [b[2:] for b in want]
    for _, labels, *rest in got:
        _check_aligned(labels, *rest)


def test_undecoded_members_are_their_bytes(wds_shards: Path, make: Callable[..., Loader]):
    loader = make(wds_shards, 48, num_workers=0, extras=("json", "txt", "cls"), decode_extras=False)
    ((_, labels, jsons, txts, cls),) = list(loader)
    ids = labels.tolist()
    assert all(isinstance(v, bytes) for v in jsons + txts + cls)
    assert [json.loads(j)["id"] for j in jsons] == ids
    assert txts == [f"sample {i}".encode() for i in ids] and cls == [str(i).encode() for i in ids]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sample_without_a_member_asked_for_is_an_error_naming_shard_key_and_member(
    image_folder: Path, tmp_path: Path, make: Callable[..., Loader], num_workers: int
):
    data = _write_wds(tmp_path / "wds", image_folder, lacking=17)
    # asking only for what every sample has is fine
    loader = make(data, 8, num_workers=num_workers, extras=("__key__", "txt"))
    assert sorted(k for _, _, keys, _ in loader for k in keys) == [f"s{i:04d}" for i in range(48)]
    loader = make(data, 8, num_workers=num_workers, extras=("__key__", "json"))
    said = r"shard \S*wds-000001\.tar, key s0017: the sample has no \.json member"
    with pytest.raises(MissingMember, match=said) as raised:
        list(loader)
    # its own one-line message (what the command line prints); the worker's part in a note
    assert str(raised.value).startswith("shard ") and "\n" not in str(raised.value)
    assert "leave 'json' out of extras" in str(raised.value)
    if num_workers:
        (note,) = raised.value.__notes__
        assert note.startswith("Caught MissingMember in loader worker")
        assert "Original Traceback (most recent call last):" in note


def test_an_extras_name_it_does_not_take_is_refused_saying_which_it_takes(wds_shards: Path):
    with pytest.raises(OptionError, match=r"extras=\('jpg',\): 'jpg' is not a name it takes"):
        Loader(wds_shards, 4, device="cpu", extras=("jpg",))
    with pytest.raises(OptionError, match="'json' is given twice"):
        ShardDataset(wds_shards, extras=("json", "json"))
    with pytest.raises(OptionError, match="decode_extras must be True or False"):
        ShardDataset(wds_shards, extras="json", decode_extras="no")
    assert ShardDataset(wds_shards, extras="json").extras == ("json",)  # one name alone


def test_a_pickle_member_in_a_sample_read_whole_is_rejected(image_folder: Path, tmp_path: Path):
    """Reading samples whole checks every member, as reading images only does."""
    data = _write_wds(tmp_path / "wds", image_folder)
    shard = data / "wds-000000.tar"
    raw = bytearray(shard.read_bytes())
    at = raw.index(b"s0003.txt\0")
    raw[at : at + 9] = b"s0003.pkl"  # same length: the offsets in the index still hold
    header = raw[at : at + 512]
    header[148:156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(header)
    shard.write_bytes(bytes(raw))
    with tarfile.open(shard) as tar:
        assert tar.getmember("s0003.pkl").size > 0  # a valid tar still
    ds = ShardDataset(data, shuffle=False, extras=("txt",))
    with pytest.raises(ShardError, match=r"member 's0003\.pkl' may hold pickled objects"):
        list(ds.iter_worker(0, 1))


def test_members_with_long_names_are_read_too(image_folder: Path, tmp_path: Path):
    """Names past tar's 100 bytes (pax `path` records) are read by tarfile, not the fast walk."""
    import webdataset as wds

    images = [p.read_bytes() for p in sorted(image_folder.glob("*/*.jpg"))[:3]]
    out = tmp_path / "long"
    out.mkdir()
    with wds.ShardWriter(str(out / "wds-%06d.tar"), maxcount=10, verbose=0) as sink:
        for i, data in enumerate(images):
            sink.write({"__key__": f"{'k' * 120}{i}", "jpg": data, "cls": i, "json": {"id": i}})
    index_shards(str(out), progress=False)
    ds = ShardDataset(out, shuffle=False, extras=("__key__", "json", "cls"))
    got = [(s.label, s.extras) for s in ds.iter_worker(0, 1)]
    assert got == [(i, (f"{'k' * 120}{i}", {"id": i}, i)) for i in range(3)]
