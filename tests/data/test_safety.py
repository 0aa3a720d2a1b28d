"""Safety sweep: what index.json promises is checked on read, bad indexes and paths are clear
ShardErrors, and the shard cache never writes outside `cache_dir` nor trusts a file it finds there.
Real files and a real S3 server (moto on loopback)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from bombs import jpeg_claiming
from indexes import index_doc, read_index_doc

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.data.shards import INDEX_NAME, Index, ShardError, ShardWriter
from gpufeed.data.source import filesystem


def _copy(shards: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(shards, dst)
    return dst


def _read_all(ds: ShardDataset) -> list[tuple[str, int, bytes]]:
    return [(s.key, s.label, s.data) for s in ds.iter_worker(0, 1)]


def _index(d: Path) -> dict:
    return read_index_doc(d)


def _write_index(d: Path, doc: object) -> None:
    (d / INDEX_NAME).write_text(json.dumps(doc))


def _flip_inside_an_image(raw: bytes, entry: dict) -> bytes:
    """The shard with one byte flipped in the middle of its first image: same size, and the image
    header and tar headers intact, so only the checksum can tell."""
    at = entry["image_offsets"][0] + entry["image_sizes"][0] // 2
    return raw[:at] + bytes([raw[at] ^ 0x55]) + raw[at + 1 :]


# --- local shards: what index.json promises ----------------------------------------------------


def test_appended_junk_is_rejected_by_the_size_index_json_promises(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    with open(d / "shard-00001.tar", "ab") as f:
        f.write(b"junk" * 1000)
    ds = ShardDataset(d, shuffle=False)
    with pytest.raises(ShardError, match=r"shard-00001\.tar is \d+ bytes, longer than the \d+"):
        _read_all(ds)


def test_a_shard_read_to_its_end_is_checked_against_its_sha256(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    entry = _index(d)["shards"][1]
    victim = d / entry["name"]
    victim.write_bytes(_flip_inside_an_image(victim.read_bytes(), entry))
    ds = ShardDataset(d, shuffle=False)
    with pytest.raises(ShardError, match=rf"{entry['name']}: its SHA-256 is [0-9a-f]{{64}}, "):
        _read_all(ds)
    # the samples of the intact shards before it were delivered, and so were all but its last one
    got = []
    with pytest.raises(ShardError, match=entry["name"]):
        for s in ds.iter_worker(0, 1):
            got.append(s.key)
    assert len(got) == _index(d)["shards"][0]["samples"] + entry["samples"] - 1


def test_intact_shards_are_hashed_once_per_process(shards: Path):
    ds = ShardDataset(shards, shuffle=False)
    assert len(_read_all(ds)) == 48
    assert len(ds.source._verified) == len(ds.index.shards)
    assert len(_read_all(ds)) == 48  # the second epoch reads without hashing (same files)


def _shard_with_extra(tmp_path: Path, extra: str, where: str) -> ShardDataset:
    """Two samples a, b written by ShardWriter, with member `extra` added after a's (`where`:
    "between") or b's ("after") label, so index.json's offsets skip over it."""
    jpg = b"\xff\xd8fake\xff\xd9"
    with open(tmp_path / "s.tar", "wb") as f:
        w = ShardWriter(f, "s.tar")
        w.add("a", jpg, "jpg", 0)
        if where == "between":
            w._add(extra, pickle.dumps({"x": 1}))
        w.add("b", jpg, "jpg", 1)
        if where == "after":
            w._add(extra, pickle.dumps({"x": 1}))
        entry = w.close()
    entry.bytes = (tmp_path / "s.tar").stat().st_size
    (tmp_path / INDEX_NAME).write_bytes(Index(["c0", "c1"], [entry]).to_bytes())
    return ShardDataset(tmp_path, shuffle=False)


@pytest.mark.parametrize("where", ["between", "after"])
@pytest.mark.parametrize("extra", ["a.pickle", "a.pyd", "b.npy"])
def test_pickle_capable_members_are_rejected_on_the_indexed_read_path(
    tmp_path: Path, extra: str, where: str
):
    ds = _shard_with_extra(tmp_path, extra, where)
    assert ds.index.shards[0].indexed
    with pytest.raises(ShardError, match=rf"s\.tar: member '{extra}' may hold pickled objects"):
        _read_all(ds)


def test_harmless_extra_members_are_still_accepted_on_the_indexed_read_path(tmp_path: Path):
    got = _read_all(_shard_with_extra(tmp_path, "a.json", "between"))
    assert [k for k, _, _ in got] == ["a", "b"]


def test_data_that_is_no_tar_member_between_indexed_samples_is_rejected(tmp_path: Path):
    ds = _shard_with_extra(tmp_path, "a.txt", "between")
    raw = bytearray((tmp_path / "s.tar").read_bytes())
    txt_header = ds.index.shards[0].offsets[1] - 1024  # a.txt's header (its data: one block)
    raw[txt_header : txt_header + 512] = b"\x01" * 512
    (tmp_path / "s.tar").write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"s\.tar: no valid tar header where the next member"):
        _read_all(ds)


# --- index.json: shape, names, checksums -------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"sha256": "../../../../x"},
            r"shard shard-00000\.tar: sha256 '\.\./\.\./\.\./\.\./x' is not",
        ),
        ({"sha256": "ab" * 31}, r"is not 64 hex digits"),
        ({"name": "shard\x00.tar"}, r"shard name 'shard\\x00\.tar' holds a NUL"),
        ({"name": "../outside.tar"}, r"escapes its directory"),
        ({"name": "sub//x.tar"}, r"not a plain relative file path"),
        ({"name": 7}, r"shard name 7 is not a string"),
        ({"bytes": 1e400}, r"cannot convert float infinity"),
        ({"offsets": [-5]}, r"lengths differ|offsets outside"),
    ],
)
def test_a_bad_shard_entry_is_a_clear_error_naming_index_json(
    shards: Path, tmp_path: Path, change: dict, match: str
):
    d = _copy(shards, tmp_path)
    doc = _index(d)
    doc["shards"][0].update(change)
    (d / INDEX_NAME).write_text(json.dumps(doc).replace("Infinity", "1e400"))
    with pytest.raises(ShardError, match=rf"copy/gpufeed-index\.json: invalid index: .*{match}"):
        ShardDataset(d)


def test_negative_offsets_are_rejected(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    doc = _index(d)
    doc["shards"][0]["offsets"][0] = -512
    _write_index(d, doc)
    with pytest.raises(ShardError, match=r"shard-00000\.tar: offsets outside the shard"):
        ShardDataset(d)


@pytest.mark.parametrize(
    "doc",
    [
        [1, 2, 3],
        "gpufeed-shards",
        {"format": "gpufeed-shards", "classes": ["a"], "shards": {"name": "x"}},
        {"format": "gpufeed-shards", "classes": ["a"], "shards": ["shard-00000.tar"]},
        {"format": "gpufeed-shards", "classes": ["a"]},
    ],
)
def test_an_index_of_the_wrong_shape_is_a_clear_error(tmp_path: Path, doc: object):
    _write_index(tmp_path, doc)
    with pytest.raises(ShardError, match=r"index\.json: invalid index: .*`gpufeed pack`"):
        ShardDataset(tmp_path)


def test_an_index_that_is_not_json_text_is_a_clear_error(tmp_path: Path):
    (tmp_path / INDEX_NAME).write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ShardError, match=r"index\.json: invalid index"):
        ShardDataset(tmp_path)


# --- paths that are not what they should be ----------------------------------------------------


def test_a_data_set_path_that_is_a_file_is_a_clear_error(shards: Path, tmp_path: Path):
    (tmp_path / "notes.txt").write_text("not a data set")
    with pytest.raises(ShardError, match=r"notes\.txt is a file, not a data set directory"):
        ShardDataset(tmp_path / "notes.txt")
    with pytest.raises(ShardError, match=rf"pass its directory, {shards}, instead"):
        Loader(shards / INDEX_NAME, batch_size=4, num_workers=0)


def test_an_index_json_that_is_a_directory_is_a_clear_error(tmp_path: Path):
    (tmp_path / INDEX_NAME).mkdir()
    with pytest.raises(ShardError, match=r"cannot read .*index\.json: it is not a regular file"):
        ShardDataset(tmp_path)


def test_an_unreadable_shard_is_a_clear_error(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    (d / "shard-00002.tar").unlink()
    (d / "shard-00002.tar").mkdir()  # open() fails on it even for root
    with pytest.raises(ShardError, match=r"cannot read shard .*shard-00002\.tar: it is not a reg"):
        _read_all(ShardDataset(d, shuffle=False))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_files_are_clear_errors(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    (d / "shard-00002.tar").chmod(0)
    with pytest.raises(ShardError, match=r"cannot read shard .*shard-00002\.tar: Permission"):
        _read_all(ShardDataset(d, shuffle=False))
    (d / INDEX_NAME).chmod(0)
    with pytest.raises(ShardError, match=r"cannot read .*index\.json: permission denied"):
        ShardDataset(d)


# --- S3 and the shard cache --------------------------------------------------------------------


def _s3_index(url: str) -> dict:
    return index_doc(filesystem(url).cat_file(f"{url}/{INDEX_NAME}"))


def test_a_traversing_checksum_in_an_s3_index_is_rejected_before_anything_is_written(
    s3_shards: str, tmp_path: Path
):
    doc = _s3_index(s3_shards)
    doc["shards"][0]["sha256"] = "../../../../x"
    filesystem(s3_shards).pipe_file(f"{s3_shards}/{INDEX_NAME}", json.dumps(doc).encode())
    cache = tmp_path / "deep" / "er" / "cache"
    with pytest.raises(
        ShardError, match=r"train/gpufeed-index\.json: invalid index: shard shard-00000"
    ):
        ShardDataset(s3_shards, cache_dir=cache)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_the_cache_never_writes_through_a_link_out_of_cache_dir(s3_shards: str, tmp_path: Path):
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    ds = ShardDataset(s3_shards, shuffle=False, cache_dir=cache)
    cache_file = ds.source._cache_path(ds.index.shards[0])
    cache.mkdir()
    cache_file.parent.symlink_to(outside)  # the per-data-set directory points elsewhere
    with pytest.raises(ShardError, match=r"resolves outside the cache directory"):
        _read_all(ds)
    assert list(outside.iterdir()) == []


def _shard_bytes(url: str, name: str) -> bytes:
    return filesystem(url).cat_file(f"{url}/{name}")


@pytest.mark.parametrize("planted", ["damaged", "garbage"])
def test_a_planted_or_damaged_cache_file_is_fetched_again_not_used(
    s3_shards: str, tmp_path: Path, planted: str
):
    cache = tmp_path / "cache"
    want = _read_all(ShardDataset(s3_shards, shuffle=False))
    ds = ShardDataset(s3_shards, shuffle=False, cache_dir=cache)
    doc = _s3_index(s3_shards)
    for entry, meta in zip(ds.index.shards, doc["shards"], strict=True):
        p = ds.source._cache_path(entry)
        p.parent.mkdir(parents=True, exist_ok=True)
        raw = _shard_bytes(s3_shards, entry.name)
        bad = _flip_inside_an_image(raw, meta) if planted == "damaged" else os.urandom(len(raw))
        p.write_bytes(bad)  # the right size: the old cache took it for the shard
    assert _read_all(ds) == want
    for entry in ds.index.shards:  # and the cache now holds the real shards
        assert ds.source._cache_path(entry).read_bytes() == _shard_bytes(s3_shards, entry.name)


def test_appended_junk_on_s3_is_rejected(s3_shards: str):
    fs = filesystem(s3_shards)
    path = f"{s3_shards}/shard-00003.tar"
    fs.pipe_file(path, fs.cat_file(path) + b"junk")
    ds = ShardDataset(s3_shards, shuffle=False, chunk_size=65536)
    with pytest.raises(ShardError, match=r"shard-00003\.tar is \d+ bytes, longer than the \d+"):
        _read_all(ds)


def test_a_changed_s3_shard_fails_its_checksum_and_is_not_cached(s3_shards: str, tmp_path: Path):
    fs = filesystem(s3_shards)
    meta = _s3_index(s3_shards)["shards"][2]
    path = f"{s3_shards}/{meta['name']}"
    fs.pipe_file(path, _flip_inside_an_image(fs.cat_file(path), meta))
    cache = tmp_path / "cache"
    for cache_dir in (None, cache):
        ds = ShardDataset(s3_shards, shuffle=False, cache_dir=cache_dir, chunk_size=65536)
        with pytest.raises(ShardError, match=rf"{meta['name']}: its SHA-256 is [0-9a-f]{{64}}"):
            _read_all(ds)
    assert not any(meta["name"] in p.name for p in cache.rglob("*"))
    assert len(list(cache.rglob("*.tar"))) == 2  # the intact shards before it were cached


def _long_named_shard(tmp_path: Path, extra: str | None) -> ShardDataset:
    """Samples whose names need GNU long-name headers (over 100 bytes), so the stretches between
    and after the images go through tarfile; `extra` is added after the first sample."""
    key = "d" * 60 + "/" + "k" * 80
    jpg = b"\xff\xd8fake\xff\xd9"
    with open(tmp_path / "s.tar", "wb") as f:
        w = ShardWriter(f, "s.tar")
        w.add(key + "1", jpg, "jpg", 0)
        if extra is not None:
            w._add(extra, b"\x80\x04.")
        w.add(key + "2", jpg, "jpg", 1)
        entry = w.close()
    entry.bytes = (tmp_path / "s.tar").stat().st_size
    (tmp_path / INDEX_NAME).write_bytes(Index(["c0", "c1"], [entry]).to_bytes())
    return ShardDataset(tmp_path, shuffle=False)


def test_long_named_members_between_and_after_indexed_samples_are_checked_by_tarfile(
    tmp_path: Path,
):
    assert [label for _, label, _ in _read_all(_long_named_shard(tmp_path, None))] == [0, 1]
    with pytest.raises(ShardError, match=r"member '(x/){50}a\.pickle' may hold pickled objects"):
        _read_all(_long_named_shard(tmp_path, "x/" * 50 + "a.pickle"))


def test_a_relative_data_set_path_reads_as_before(shards: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(shards)
    assert len(_read_all(ShardDataset(".", shuffle=False))) == 48
    monkeypatch.chdir(shards.parent)
    assert len(_read_all(ShardDataset(shards.name, shuffle=False))) == 48


def test_an_s3_url_of_the_index_itself_says_to_pass_its_directory(s3_shards: str):
    with pytest.raises(ShardError, match=rf"pass its directory, {s3_shards}, instead"):
        ShardDataset(f"{s3_shards}/{INDEX_NAME}")


# --- a decompression bomb inside a shard --------------------------------------------------------


_LOADER_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a regression fails, not swaps
from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader
with Loader(sys.argv[1], 4, num_workers=int(sys.argv[2]), augment=Augment(size=(16, 16)),
            device="cpu", shuffle=False) as loader:
    labels = [int(y) for _, ys in loader for y in ys]
    corrupt = loader.stats()["corrupt_samples"]
print(json.dumps({"labels": labels, "corrupt": corrupt}))
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_a_jpeg_bomb_in_a_shard_is_skipped_as_corrupt_with_its_reason(tmp_path: Path, workers):
    rng = np.random.default_rng(0)
    with open(tmp_path / "s.tar", "wb") as f:
        w = ShardWriter(f, "s.tar")
        for i in range(4):
            img = (rng.random((24, 32, 3)) * 255).astype(np.uint8)
            w.add(f"k{i}", simplejpeg.encode_jpeg(img), "jpg", i)
        w.add("bomb", jpeg_claiming(60000, 60000), "jpg", 9)
        entry = w.close()
    entry.bytes = (tmp_path / "s.tar").stat().st_size
    (tmp_path / INDEX_NAME).write_bytes(Index(["c"] * 10, [entry]).to_bytes())
    out = subprocess.run(
        [sys.executable, "-c", _LOADER_CHILD, str(tmp_path), str(workers)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["labels"] == [0, 1, 2, 3]
    assert [(c["key"], c["reason"][:40]) for c in got["corrupt"]] == [
        ("bomb", "image claims 60000×60000 pixels, over th")
    ]
