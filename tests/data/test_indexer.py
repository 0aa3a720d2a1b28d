"""index: shards written by webdataset's own ShardWriter become gpufeed data sets (local, S3, brace
URLs) that the Loader reads with every guarantee it gives its own shards; bad shards are clear
one-line errors."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from gpufeed.cli import app
from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.indexer import MAX_SHARDS, brace_count, expand_urls, index_shards
from gpufeed.data.loader import Loader
from gpufeed.data.packing import pack
from gpufeed.data.shards import INDEX_NAME, ShardError
from gpufeed.data.source import filesystem

SMALL = Augment(size=(16, 16))
PATTERN = "wds-{000000..000003}.tar"


def _images(image_folder: Path) -> list[tuple[str, bytes]]:
    """(class name, JPEG bytes) of the test images, in a fixed order."""
    return [(p.parent.name, p.read_bytes()) for p in sorted(image_folder.glob("*/*.jpg"))]


def _write_wds(
    out: Path,
    samples: list[dict[str, Any]],
    pattern: str = "wds-%06d.tar",
    maxcount: int = 13,
) -> list[Path]:
    """Shards written by webdataset.ShardWriter itself."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / pattern), maxcount=maxcount, verbose=0) as sink:
        for s in samples:
            sink.write(s)
    return sorted(out.glob("*.tar"))


@pytest.fixture
def wds_dir(image_folder: Path, tmp_path: Path) -> Path:
    """48 samples in 4 WebDataset shards; `.cls` is the sample's number, so labels name samples."""
    samples = [
        {"__key__": f"s{i:04d}", "jpg": data, "cls": i}
        for i, (_, data) in enumerate(_images(image_folder))
    ]
    _write_wds(tmp_path / "wds", samples)
    return tmp_path / "wds"


@pytest.fixture
def make() -> Iterator[Callable[..., Loader]]:
    """`make(url, batch_size, **options)`: a Loader of 16×16 images, closed after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda *a, **kw: stack.enter_context(Loader(*a, **{"augment": SMALL, **kw}))


def _labels(loader: Loader) -> list[int]:
    return [int(x) for _, y in loader for x in y]


# --- reading indexed WebDataset shards --------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_indexed_webdataset_shards_deliver_every_sample_once(
    wds_dir: Path, make: Callable[..., Loader], workers: int
):
    result = index_shards(str(wds_dir / PATTERN), progress=False)
    assert (result.shards, result.samples, result.classes) == (4, 48, 48)
    assert result.index == f"{wds_dir}/{INDEX_NAME}"
    for url in (wds_dir, str(wds_dir / PATTERN)):
        assert sorted(_labels(make(url, 5, num_workers=workers))) == list(range(48))


def test_the_loader_reads_the_images_webdataset_wrote(wds_dir: Path, image_folder: Path):
    index_shards(str(wds_dir / PATTERN), progress=False)
    ds = ShardDataset(str(wds_dir / PATTERN), shuffle=False)
    got = {s.key: (s.label, s.data) for s in ds.iter_worker(0, 1)}
    want = {f"s{i:04d}": (i, data) for i, (_, data) in enumerate(_images(image_folder))}
    assert got == want


def test_upper_case_image_extensions_as_imagenet_names_them_are_read(
    image_folder: Path, tmp_path: Path, make: Callable[..., Loader]
):
    # n01440764_10026.JPEG: indexed, then refused by the reader ("found member ….JPEG where the
    # index puts ….jpeg")
    samples = [
        {"__key__": f"n0144_{i}", "JPEG": data, "cls": i}
        for i, (_, data) in enumerate(_images(image_folder)[:12])
    ]
    _write_wds(tmp_path / "wds", samples)
    index_shards(str(tmp_path / "wds"), progress=False)
    assert sorted(_labels(make(tmp_path / "wds", 4, num_workers=0))) == list(range(12))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_tar_with_folder_entries_as_gnu_tar_writes_is_indexed_and_read(
    image_folder: Path, tmp_path: Path, make: Callable[..., Loader], workers: int
):
    tree = tmp_path / "tree" / "sub"
    tree.mkdir(parents=True)
    for i, (_, data) in enumerate(_images(image_folder)[:6]):
        (tree / f"s{i}.jpg").write_bytes(data)
        (tree / f"s{i}.cls").write_text(str(i))
    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "h-0.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(tmp_path / "tree" / "sub", arcname="sub")  # a folder entry "sub/", then files
    with tarfile.open(tmp_path / "wds" / "h-0.tar") as tar:
        assert tar.getmembers()[0].isdir()
    index_shards(str(tmp_path / "wds"), progress=False)  # "member 'sub' is not a regular file"
    assert sorted(_labels(make(tmp_path / "wds", 4, num_workers=workers))) == list(range(6))
    # its first sample starts past byte 0, yet the shard is still hashed: a changed byte is found
    entry = ShardDataset(tmp_path / "wds").index.shards[0]
    assert int(entry.offsets[0]) > 0
    raw = bytearray((tmp_path / "wds" / "h-0.tar").read_bytes())
    raw[int(entry.image_offsets[2]) + 100] ^= 0x55
    (tmp_path / "wds" / "h-0.tar").write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"h-0\.tar: its SHA-256 is"):
        _labels(make(tmp_path / "wds", 4, num_workers=workers))


def test_a_brace_url_reads_only_the_shards_it_names(wds_dir: Path, make: Callable[..., Loader]):
    index_shards(str(wds_dir / PATTERN), progress=False)
    assert sorted(_labels(make(str(wds_dir / "wds-{000001..000002}.tar"), 4))) == list(
        range(13, 39)
    )


def test_resuming_mid_epoch_delivers_exactly_the_rest(wds_dir: Path, make: Callable[..., Loader]):
    index_shards(str(wds_dir / PATTERN), progress=False)
    url = str(wds_dir / PATTERN)
    whole = _labels(make(url, 4, num_workers=2, seed=5))
    loader = make(url, 4, num_workers=2, seed=5)
    first = []
    for i, (_, y) in enumerate(loader):
        first += y.tolist()
        if i == 4:
            state = loader.state_dict()
            break
    resumed = make(url, 4, num_workers=2, seed=5)
    resumed.load_state_dict(state)
    assert first + _labels(resumed) == whole


def test_a_shard_changed_after_indexing_fails_its_checksum(
    wds_dir: Path, make: Callable[..., Loader]
):
    index_shards(str(wds_dir / PATTERN), progress=False)
    shard = wds_dir / "wds-000002.tar"
    entry = ShardDataset(wds_dir).index.shards[2]
    raw = bytearray(shard.read_bytes())
    raw[int(entry.image_offsets[0]) + 100] ^= 0x55  # inside an image: only the SHA-256 can tell
    shard.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"wds-000002\.tar: its SHA-256 is"):
        _labels(make(wds_dir, 4, num_workers=0, shuffle=False))


def test_a_corrupt_image_is_reported_by_shard_and_key(
    image_folder: Path, tmp_path: Path, make: Callable[..., Loader]
):
    samples = [
        {"__key__": f"k{i}", "jpg": d, "cls": 0}
        for i, (_, d) in enumerate(_images(image_folder)[:7])
    ]
    samples[3]["jpg"] = b"\xff\xd8 not really a jpeg"
    _write_wds(tmp_path / "c", samples, maxcount=100)
    index_shards(str(tmp_path / "c" / "wds-000000.tar"), progress=False)
    loader = make(tmp_path / "c", 4, num_workers=0)
    assert sum(len(y) for _, y in loader) == 6
    (report,) = loader.stats()["corrupt_samples"]
    assert report["shard"].endswith("wds-000000.tar") and report["key"] == "k3"


# --- labels -------------------------------------------------------------------------------------


def test_class_names_in_json_are_numbered_in_sorted_order(image_folder: Path, tmp_path: Path):
    samples = [
        {"__key__": f"k{i:03d}", "jpg": d, "json": {"label": name}}
        for i, (name, d) in enumerate(_images(image_folder))
    ]
    _write_wds(tmp_path / "j", samples)
    result = index_shards(str(tmp_path / "j" / PATTERN), progress=False)
    ds = ShardDataset(tmp_path / "j", shuffle=False)
    names = sorted({n for n, _ in _images(image_folder)})
    assert ds.classes == names and result.classes == len(names)
    got = {s.key: ds.classes[s.label] for s in ds.iter_worker(0, 1)}
    assert got == {f"k{i:03d}": name for i, (name, _) in enumerate(_images(image_folder))}


def test_a_given_mapping_numbers_the_classes(image_folder: Path, tmp_path: Path):
    names = sorted({n for n, _ in _images(image_folder)}, reverse=True)
    mapping = tmp_path / "classes.json"
    mapping.write_text(json.dumps({n: i for i, n in enumerate(names)}))
    samples = [
        {"__key__": f"k{i:03d}", "jpg": d, "cls": name}
        for i, (name, d) in enumerate(_images(image_folder))
    ]
    _write_wds(tmp_path / "m", samples)
    index_shards(str(tmp_path / "m" / PATTERN), classes=mapping, progress=False)
    ds = ShardDataset(tmp_path / "m", shuffle=False)
    assert ds.classes == names
    assert {ds.classes[s.label] for s in ds.iter_worker(0, 1)} == set(names)


def test_an_unknown_class_is_a_clear_error(image_folder: Path, tmp_path: Path):
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    samples = [{"__key__": "a", "jpg": _images(image_folder)[0][1], "cls": "zebra"}]
    _write_wds(tmp_path / "u", samples)
    with pytest.raises(ShardError, match=r"unknown class 'zebra' \(not one of the 2 classes"):
        index_shards(str(tmp_path / "u" / "wds-000000.tar"), classes=tmp_path / "classes.txt")
    assert not (tmp_path / "u" / INDEX_NAME).exists()


def test_train_and_val_indexed_in_one_directory_keep_both(
    wds_dir: Path, make: Callable[..., Loader]
):
    index_shards(str(wds_dir / "wds-{000000..000002}.tar"), progress=False)
    index_shards(str(wds_dir / "wds-000003.tar"), progress=False)
    assert sorted(_labels(make(str(wds_dir / "wds-000003.tar"), 4))) == list(range(39, 48))
    assert sorted(_labels(make(str(wds_dir / PATTERN), 4))) == list(range(48))


def test_shards_kept_from_the_index_there_are_counted_and_listed_in_name_order(wds_dir: Path):
    index_shards(str(wds_dir / "wds-{000001..000003}.tar"), progress=False)
    result = index_shards(str(wds_dir / "wds-000000.tar"), progress=False)
    names = [s.name for s in ShardDataset(wds_dir).index.shards]
    assert names == [f"wds-{i:06d}.tar" for i in range(4)]  # as indexing them at once lists them
    assert result.summary().startswith(
        f"indexed 1 shard into {wds_dir / INDEX_NAME}, which now lists 48 samples of 48 classes "
        "in 4 shards"
    )
    assert (result.shards, result.samples, result.indexed, result.kept) == (4, 48, 1, 3)


def test_indexing_a_folder_again_drops_the_shards_that_are_gone(
    wds_dir: Path, make: Callable[..., Loader]
):
    # the index kept the gone shard, first: the loader failed on it ("is missing")
    index_shards(wds_dir, progress=False)
    (wds_dir / "wds-000000.tar").unlink()  # the data set written again, with fewer shards
    result = index_shards(wds_dir, progress=False)
    assert sorted(_labels(make(wds_dir, 5, num_workers=0))) == list(range(13, 48))
    assert "dropped 1 shard it listed whose file is gone (wds-000000.tar)" in result.summary()
    assert (result.shards, result.samples, result.dropped) == (3, 35, ["wds-000000.tar"])


def test_label_text_that_is_no_plain_integer_is_a_class_name(image_folder: Path, tmp_path: Path):
    # '²' passes str.isdigit(), then int() refused it: a traceback
    jpg = _images(image_folder)[0][1]
    (tmp_path / "c").mkdir()
    members = {"a.jpg": jpg, "a.cls": "²".encode(), "b.jpg": jpg, "b.cls": b"cat"}
    index_shards(str(_one_tar(tmp_path / "c" / "c.tar", members)), progress=False)
    assert ShardDataset(tmp_path / "c").classes == ["cat", "²"]


def test_a_json_label_written_as_a_whole_float_is_a_class_id(image_folder: Path, tmp_path: Path):
    jpg = _images(image_folder)[0][1]
    (tmp_path / "j").mkdir()
    members = {"a.jpg": jpg, "a.json": b'{"label": 1.0}', "b.jpg": jpg, "b.json": b'{"label": 0}'}
    index_shards(str(_one_tar(tmp_path / "j" / "j.tar", members)), progress=False)
    ds = ShardDataset(tmp_path / "j", shuffle=False)
    assert {s.key: s.label for s in ds.iter_worker(0, 1)} == {"a": 1, "b": 0}
    # "2" as text is the class id 2, as a .cls file says it; not a name sorted before "10"
    labels = {f"k{i:02d}": i for i in range(12)}
    members = {}
    for key, i in labels.items():
        members |= {f"{key}.jpg": jpg, f"{key}.json": f'{{"label": "{i}"}}'.encode()}
    index_shards(str(_one_tar(tmp_path / "j" / "j.tar", members)), progress=False)
    ds = ShardDataset(tmp_path / "j", shuffle=False)
    assert {s.key: s.label for s in ds.iter_worker(0, 1)} == labels
    _one_tar(tmp_path / "j" / "j.tar", {"a.jpg": jpg, "a.json": b'{"label": 1.5}'})
    with pytest.raises(
        ShardError, match=r"j\.tar: label 1\.5 in sample 'a' is not an integer or a class name"
    ):
        index_shards(str(tmp_path / "j" / "j.tar"), progress=False)


def test_a_pack_indexed_again_keeps_its_class_names(image_folder: Path, tmp_path: Path):
    # pack writes integer .cls labels: indexing its shards again named the classes "0", "1", ...
    with pytest.warns(UserWarning, match="outside 1-128 MB"):
        pack(image_folder, tmp_path / "p", shard_size="64KB", workers=1, progress=False)
    names = ShardDataset(tmp_path / "p").classes
    index_shards(str(tmp_path / "p"), progress=False)
    assert ShardDataset(tmp_path / "p").classes == names == [f"class_{i:03d}" for i in range(4)]
    first = sorted(p.name for p in (tmp_path / "p").glob("*.tar"))[0]
    index_shards(str(tmp_path / "p" / first), progress=False)  # one shard, beside the others
    assert ShardDataset(tmp_path / "p").classes == names


# --- bad input ----------------------------------------------------------------------------------


def _one_tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    return path


def test_a_file_that_is_not_a_tar_is_a_clear_error(tmp_path: Path):
    (tmp_path / "x.tar").write_bytes(b"this is not a tar file at all" * 40)
    with pytest.raises(ShardError, match=r"x\.tar is not an uncompressed tar file"):
        index_shards(str(tmp_path / "x.tar"), progress=False)


def test_a_compressed_shard_is_a_clear_error(tmp_path: Path):
    raw = _one_tar(tmp_path / "a.tar", {"k.jpg": b"\xff\xd8", "k.cls": b"1"}).read_bytes()
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress(raw))
    with pytest.raises(ShardError, match=r"a\.tar\.gz is not an uncompressed.*decompress it"):
        index_shards([str(tmp_path / "a.tar.gz")], progress=False)


def test_a_sample_without_an_image_is_a_clear_error(tmp_path: Path):
    _one_tar(tmp_path / "t.tar", {"k.txt": b"hello", "k.cls": b"1"})
    with pytest.raises(ShardError, match=r"t\.tar: sample 'k' has no image member"):
        index_shards(str(tmp_path / "t.tar"), progress=False)


def test_a_sample_without_a_label_is_a_clear_error(tmp_path: Path):
    _one_tar(tmp_path / "t.tar", {"k.jpg": b"\xff\xd8", "k.json": b'{"caption": "a cat"}'})
    with pytest.raises(ShardError, match=r"sample 'k' has no label in its \.json.*--label-field"):
        index_shards(str(tmp_path / "t.tar"), progress=False)


def test_a_pickle_member_is_rejected(tmp_path: Path):
    _one_tar(tmp_path / "t.tar", {"k.jpg": b"\xff\xd8", "k.pyd": b"\x80\x04."})
    with pytest.raises(ShardError, match="never unpickles"):
        index_shards(str(tmp_path / "t.tar"), progress=False)


def _shard(kind: str, wds_dir: Path, image_folder: Path, tmp_path: Path) -> Path:
    """A shard the fast scanner reads (webdataset's) or one only tarfile reads (long names)."""
    if kind == "webdataset":
        return wds_dir / "wds-000001.tar"
    (tmp_path / "long").mkdir()
    members: dict[str, bytes] = {}
    for i, (_, jpg) in enumerate(_images(image_folder)[:6]):
        members |= {f"{'d' * 120}{i}.jpg": jpg, f"{'d' * 120}{i}.cls": str(i).encode()}
    return _one_tar(tmp_path / "long" / "long-0.tar", members)


@pytest.mark.parametrize("kind", ["webdataset", "long names"])
@pytest.mark.parametrize(
    "cut, ends",
    [
        ("at a header", "after a member, without tar's end-of-archive marker"),
        ("inside a header", "inside a tar header"),
        ("inside an image", "inside "),
    ],
)
def test_a_shard_cut_short_is_a_clear_error_not_fewer_samples(
    kind: str, cut: str, ends: str, wds_dir: Path, image_folder: Path, tmp_path: Path
):
    # cut at a header, the samples after the cut were silently left out of the index
    shard = _shard(kind, wds_dir, image_folder, tmp_path)
    with tarfile.open(shard) as tar:
        third = [m for m in tar.getmembers() if m.name.endswith(".jpg")][2]
    at = {
        "at a header": third.offset,
        "inside a header": third.offset + 100,
        "inside an image": third.offset_data + 100,
    }[cut]
    shard.write_bytes(shard.read_bytes()[:at])
    with pytest.raises(ShardError) as err:
        index_shards(str(shard), progress=False)
    assert f"{shard.name} is truncated at byte {at}: it ends {ends}" in str(err.value)
    assert str(err.value).endswith("re-write it")
    assert not (shard.parent / INDEX_NAME).exists()


@pytest.mark.parametrize("kind", ["webdataset", "long names"])
def test_a_broken_header_inside_a_shard_is_a_clear_error_not_its_end(
    kind: str, wds_dir: Path, image_folder: Path, tmp_path: Path
):
    shard = _shard(kind, wds_dir, image_folder, tmp_path)
    with tarfile.open(shard) as tar:
        third = [m for m in tar.getmembers() if m.name.endswith(".jpg")][2]
    raw = bytearray(shard.read_bytes())
    raw[third.offset : third.offset + 512] = b"x" * 512
    shard.write_bytes(bytes(raw))
    with pytest.raises(
        ShardError, match=rf"{re.escape(shard.name)}: no valid tar header at byte {third.offset},"
    ):
        index_shards(str(shard), progress=False)


def test_a_shard_ending_in_one_zero_block_is_whole(wds_dir: Path, make: Callable[..., Loader]):
    # tarfile and GNU tar end a tar with two zero blocks (then pad it): the first marks the end
    shard = wds_dir / "wds-000003.tar"
    with tarfile.open(shard) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512
    shard.write_bytes(shard.read_bytes()[: end + 512])
    assert index_shards(wds_dir, progress=False).samples == 48
    assert sorted(_labels(make(wds_dir, 5, num_workers=0))) == list(range(48))


def test_an_index_there_that_cannot_be_read_is_refused_before_any_shard_is_read(wds_dir: Path):
    (wds_dir / INDEX_NAME).write_text("{}")
    (wds_dir / "zz-not-a-tar.tar").write_bytes(b"not a tar " * 100)  # reading it fails
    with pytest.raises(ShardError) as err:
        index_shards(wds_dir, progress=False)
    msg = str(err.value)
    assert msg.startswith(f"{wds_dir / INDEX_NAME}: invalid index")
    assert msg.endswith("delete it (or move it away) and run `gpufeed index` again")
    assert "re-create it" not in msg


@pytest.fixture
def modes_bind() -> list[str]:
    """A command prefix under which folder modes bind: root's override of them dropped."""
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    prefix = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode != 0:
        pytest.skip("running as root, and setpriv cannot drop the override of folder modes")
    return prefix


def test_a_read_only_folder_is_refused_in_one_line_before_any_shard_is_read(
    wds_dir: Path, modes_bind: list[str]
):
    # the index was written after reading every shard: a PermissionError traceback
    (wds_dir / "zz-not-a-tar.tar").write_bytes(b"not a tar " * 100)  # reading it fails
    wds_dir.chmod(0o555)
    try:
        cmd = [*modes_bind, sys.executable, "-m", "gpufeed.cli", "index", str(wds_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        wds_dir.chmod(0o755)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"cannot write {wds_dir / INDEX_NAME}: permission denied; " in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_missing_shard_is_a_clear_error(wds_dir: Path):
    with pytest.raises(ShardError, match=r"shard \S*wds-000004\.tar not found"):
        index_shards(str(wds_dir / "wds-{000003..000009}.tar"), progress=False)


def test_a_missing_folder_of_shards_is_named(tmp_path: Path):
    with pytest.raises(
        ShardError, match=r"shard \S*nowhere/x-0\.tar not found: there is no folder"
    ):
        index_shards(str(tmp_path / "nowhere" / "x-{0..9}.tar"), progress=False)


@pytest.mark.parametrize(
    "pattern",
    [
        "x.tar",
        "x-{0..9}.tar",
        "x-{000..120..7}-{a,b,c}.tar",
        "{a..e}/{1..3}{,-val}.tar",
        "x-{5..1}-{Z..c..2}.tar",
        "x-{a,{b,c}{1..3}}.tar",
        r"x-\{0..9\}.tar",
        "x-{}.tar",
        "x-{abc}.tar",
    ],
)
def test_brace_patterns_are_counted_as_braceexpand_expands_them(pattern: str):
    from braceexpand import braceexpand

    assert brace_count(pattern) == len(list(braceexpand(pattern)))


def test_an_absurd_brace_range_is_refused_before_it_is_expanded(wds_dir: Path):
    start = time.monotonic()
    with pytest.raises(ShardError, match=r"names 100,000,000 shards, more than the 1,000,000"):
        index_shards(str(wds_dir / "wds-{00000..99999999}.tar"), progress=False)
    with pytest.raises(ShardError, match=r"names 100,000,000 shards"):  # nothing is fetched
        ShardDataset("s3://bucket/wds-{00000000..99999999}.tar")
    res = CliRunner().invoke(app, ["index", str(wds_dir / "wds-{00000..99999999}.tar")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "check the brace range" in res.output
    assert time.monotonic() - start < 10  # expanding it took minutes and gigabytes
    assert len(expand_urls(f"s3://b/x-{{1..{MAX_SHARDS}}}.tar")) == MAX_SHARDS


def test_loading_shards_that_were_never_indexed_says_to_index_them(wds_dir: Path, tmp_path: Path):
    index_shards(str(wds_dir / "wds-000000.tar"), progress=False)
    with pytest.raises(ShardError, match=r"wds-000001\.tar is not in .*`gpufeed index"):
        ShardDataset(str(wds_dir / "wds-{000000..000001}.tar"))


# --- command line and S3 ------------------------------------------------------------------------


def test_the_index_command_prints_what_it_wrote(wds_dir: Path):
    res = CliRunner().invoke(app, ["index", str(wds_dir / PATTERN)])
    assert res.exit_code == 0, res.output
    assert "indexed 48 samples of 48 classes in 4 shards" in res.output
    assert str(wds_dir / INDEX_NAME) in res.output


def test_the_index_command_reports_bad_input_in_one_line(tmp_path: Path):
    res = CliRunner().invoke(app, ["index", str(tmp_path / "nothing-{0..1}.tar")])
    assert res.exit_code == 2
    assert "Traceback" not in res.output and "nothing-0.tar not found" in res.output


@contextlib.contextmanager
def _served(handler: Any) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 with `handler` (a request handler class): its base URL."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[str]:
    """A folder served over HTTP on 127.0.0.1 (an empty one: every shard is missing)."""
    import functools
    import http.server

    with _served(
        functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    ) as url:
        yield url


def test_an_http_shard_error_names_the_url_and_its_endpoint_not_s3(http_folder: str):
    import socket

    with pytest.raises(ShardError) as missing:
        index_shards(f"{http_folder}/x.tar", progress=False)
    assert f"{http_folder}/x.tar" in str(missing.value) and "not found" in str(missing.value)
    assert "S3" not in str(missing.value)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/x.tar"
    res = CliRunner().invoke(app, ["index", closed])
    assert res.exit_code == 2 and f"cannot read {closed}: cannot connect" in res.output
    assert "S3" not in res.output


def _on_s3(folder: Path) -> str:
    """The .tar files of `folder` copied under a new bucket: their s3://BUCKET/wds prefix."""
    fs = filesystem("s3://x")
    bucket = f"bucket-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    for p in sorted(folder.glob("*.tar")):
        fs.put_file(str(p), f"{bucket}/wds/{p.name}")
    return f"s3://{bucket}/wds"


def test_shards_on_s3_are_indexed_and_streamed(
    s3_env: str, wds_dir: Path, make: Callable[..., Loader]
):
    fs = filesystem("s3://x")
    prefix = _on_s3(wds_dir)
    url = f"{prefix}/{PATTERN}"
    result = index_shards(url, progress=False)
    assert result.index == f"{prefix}/{INDEX_NAME}" and result.samples == 48
    assert sorted(_labels(make(url, 5, num_workers=2, chunk_size=4096))) == list(range(48))
    written = fs.cat_file(f"{prefix}/{INDEX_NAME}")
    res = CliRunner().invoke(app, ["index", url, "--timeout", "60"])  # the command line's deadline
    assert res.exit_code == 0, res.output
    assert fs.cat_file(f"{prefix}/{INDEX_NAME}") == written
    local = Path(str(wds_dir) + "-copy")
    shutil.copytree(wds_dir, local)
    index_shards(str(local / PATTERN), progress=False)  # the same bytes give the same index
    assert (local / INDEX_NAME).read_bytes() == fs.cat_file(f"{prefix}/{INDEX_NAME}")


def test_an_s3_prefix_stands_for_its_tar_files(s3_env: str, wds_dir: Path):
    # it was read as one shard: "not an uncompressed tar file (empty file)"
    prefix = _on_s3(wds_dir)
    for url in (prefix, f"{prefix}/"):
        result = index_shards(url, progress=False)
        assert (result.index, result.shards, result.samples) == (f"{prefix}/{INDEX_NAME}", 4, 48)
    filesystem(prefix).pipe_file(f"{prefix}/notes/readme.txt", b"no shards here")
    with pytest.raises(ShardError, match=r"wds/notes is a folder without \.tar files: name the"):
        index_shards(f"{prefix}/notes", progress=False)


@pytest.fixture
def stalling_http(wds_dir: Path) -> Iterator[str]:
    """`wds_dir` served over HTTP on 127.0.0.1: HEAD is answered (sizes), the GET of a shard
    only after a minute."""
    import http.server
    import threading

    release = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(wds_dir), **kwargs)

        def do_GET(self) -> None:
            if not self.path.endswith(".tar"):
                super().do_GET()
                return
            release.wait(60)
            with contextlib.suppress(OSError):  # the client gave up long ago
                self.send_error(503)

        def log_message(self, *args: Any) -> None:
            pass

    with _served(Handler) as url:
        try:
            yield url
        finally:
            release.set()  # before the server shuts down: its handlers wait on it


def test_a_shard_read_that_gets_no_answer_fails_at_the_deadline_naming_it(stalling_http: str):
    # shards were streamed past gpufeed's remote reads: `--timeout 5` took 26 s, botocore's words
    url = f"{stalling_http}/wds-000000.tar"
    start = time.monotonic()
    with pytest.raises(ShardError) as err:
        index_shards(url, storage_options={"timeout": 2}, progress=False)
    assert time.monotonic() - start < 20
    assert f"cannot read {url}: no answer within 2 s" in str(err.value)


def test_images_come_out_as_batches_of_the_right_shape(wds_dir: Path, make: Callable[..., Loader]):
    index_shards(str(wds_dir / PATTERN), progress=False)
    images, labels = next(iter(make(wds_dir, 8, num_workers=0)))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.float32
    assert labels.shape == (8,)


def test_a_local_directory_stands_for_its_tar_files(wds_dir: Path, tmp_path: Path):
    assert index_shards(wds_dir, progress=False).shards == 4
    (tmp_path / "empty").mkdir()
    with pytest.raises(ShardError, match=r"empty is a directory without \.tar files"):
        index_shards(tmp_path / "empty", progress=False)


def test_labels_mixing_ids_and_names_need_the_class_list(image_folder: Path, tmp_path: Path):
    data = _images(image_folder)[0][1]
    samples = [{"__key__": "a", "jpg": data, "cls": 3}, {"__key__": "b", "jpg": data, "cls": "cat"}]
    _write_wds(tmp_path / "x", samples)
    with pytest.raises(ShardError, match=r"mix integer ids and class names; pass .*--classes"):
        index_shards(str(tmp_path / "x" / "wds-000000.tar"), progress=False)


def test_one_scanner_finds_the_members_where_tarfile_finds_them(wds_dir: Path, tmp_path: Path):
    # there were two scanners here (a fast one, tarfile for the rest) and a third in the Loader
    shard = wds_dir / "wds-000001.tar"
    index_shards(str(shard), progress=False)
    entry = ShardDataset(wds_dir).index.shards[0]
    with tarfile.open(shard) as tar:
        infos = tar.getmembers()
    jpgs = [m for m in infos if m.name.endswith(".jpg")]
    assert [int(x) for x in entry.image_offsets] == [m.offset_data for m in jpgs]
    assert [int(x) for x in entry.image_sizes] == [m.size for m in jpgs]
    firsts = {m.name.split(".")[0]: m.offset for m in reversed(infos)}  # a key's first header
    assert [int(x) for x in entry.offsets] == [firsts[k] for k in entry.keys]
    long_key = "d" * 120  # a GNU long-name header
    _one_tar(tmp_path / "long.tar", {f"{long_key}.jpg": b"\xff\xd8", f"{long_key}.cls": b"2"})
    result = index_shards(str(tmp_path / "long.tar"), progress=False)
    assert result.samples == 1
    assert [s.key for s in ShardDataset(tmp_path).iter_worker(0, 1)] == [long_key]


@pytest.mark.parametrize("member", [("k.json", b'{"cls": 4e9}'), ("k.cls", b"4000000000")])
def test_a_huge_numeric_label_is_a_clear_error_not_a_class_list_that_fills_memory(
    tmp_path: Path, member: tuple[str, bytes]
):
    # {"cls": 1e300} made a list of 10^300 class names: the process grew until it was killed
    shard = _one_tar(tmp_path / "j.tar", {"k.jpg": b"\xff\xd8", member[0]: member[1]})
    with pytest.raises(
        ShardError, match=r"j\.tar: label 4000000000 of sample 'k' is over 1,000,000"
    ):
        index_shards(str(shard), progress=False)


def test_a_tar_of_dot_reads_back_every_sample(image_folder: Path, tmp_path: Path, make):
    # `tar -C DIR -cf x.tar .` names members ./KEY.jpg: indexed as KEY, then every read failed
    members: dict[str, bytes] = {}
    for i, (_, data) in enumerate(_images(image_folder)[:6]):
        members[f"./s{i}.jpg"] = data
        members[f"./s{i}.json"] = json.dumps({"cls": i}).encode()
    _one_tar(tmp_path / "dot.tar", members)
    index_shards(str(tmp_path / "dot.tar"), progress=False)
    loader = make(str(tmp_path), 2, num_workers=1, shuffle=False, strict=True)
    assert sorted(_labels(loader)) == list(range(6))
