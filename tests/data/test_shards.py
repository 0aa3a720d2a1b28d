"""The shard format: WebDataset-compatible tars, and safe, clear failures on bad shards."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from bombs import tar_header
from indexes import read_index_doc

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.shards import INDEX_NAME, ShardError, iter_samples


def test_webdataset_reads_the_shards_we_write(shards: Path):
    import webdataset as wds

    index = read_index_doc(shards)
    urls = [str(shards / s["name"]) for s in index["shards"]]
    got = {s["__key__"]: int(s["cls"]) for s in wds.WebDataset(urls, shardshuffle=False)}
    want = {k: lab for s in index["shards"] for k, lab in zip(s["keys"], s["labels"], strict=True)}
    assert got == want
    one = next(iter(wds.WebDataset(urls[:1], shardshuffle=False).decode("rgb8")))
    assert one["jpg"].ndim == 3 and one["jpg"].shape[2] == 3


def test_index_offsets_point_at_each_image(shards: Path):
    index = read_index_doc(shards)
    s = index["shards"][1]
    raw = (shards / s["name"]).read_bytes()
    assert len(raw) == s["bytes"]
    for off, size in zip(s["image_offsets"], s["image_sizes"], strict=True):
        assert raw[off : off + 2] == b"\xff\xd8" and raw[off + size - 2 : off + size] == b"\xff\xd9"


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    "name", ["../evil.jpg", "/etc/evil.jpg", "a/../../evil.jpg", "C:/evil.jpg", "a\\..\\evil.jpg"]
)
def test_member_names_that_escape_a_directory_are_rejected(name: str):
    with pytest.raises(ShardError, match="escapes its directory"):
        list(iter_samples(_tar([(tarfile.TarInfo(name), b"x")]), "s.tar"))


def test_links_are_rejected():
    link = tarfile.TarInfo("k.jpg")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(ShardError, match="is a link"):
        list(iter_samples(_tar([(link, b"")]), "s.tar"))


@pytest.mark.parametrize("ext", ["pickle", "pyd", "pth", "npy"])
def test_pickle_capable_members_are_rejected_never_loaded(ext: str):
    members = [(tarfile.TarInfo("k.jpg"), b"\xff\xd8"), (tarfile.TarInfo(f"k.{ext}"), b"\x80\x04.")]
    with pytest.raises(ShardError, match="never unpickles"):
        list(iter_samples(_tar(members), "s.tar"))


def test_unknown_member_types_are_ignored_and_keys_grouped():
    members = [
        (tarfile.TarInfo("a.jpg"), b"A"),
        (tarfile.TarInfo("a.cls"), b"1"),
        (tarfile.TarInfo("a.weird"), b"?"),
        (tarfile.TarInfo("b.png"), b"B"),
    ]
    assert list(iter_samples(_tar(members), "s.tar")) == [
        ("a", {"jpg": b"A", "cls": b"1"}),
        ("b", {"png": b"B"}),
    ]


def _copy(shards: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(shards, dst)
    return dst


def test_truncated_shard_is_a_clear_error_naming_it(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    victim = d / "shard-00002.tar"
    victim.write_bytes(victim.read_bytes()[:5000])
    ds = ShardDataset(d, shuffle=False)
    with pytest.raises(ShardError, match=r"shard-00002\.tar is truncated"):
        list(ds.iter_worker(0, 1))


def test_missing_shard_is_a_clear_error_naming_it(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    (d / "shard-00003.tar").unlink()
    with pytest.raises(ShardError, match=r"shard-00003\.tar is missing"):
        list(ShardDataset(d, shuffle=False).iter_worker(0, 1))


def test_index_that_does_not_match_its_shard_is_detected(shards: Path, tmp_path: Path):
    d = _copy(shards, tmp_path)
    (d / "shard-00001.tar").write_bytes(
        (d / "shard-00000.tar").read_bytes()[:20000] + b"\0" * 20000
    )
    index = read_index_doc(d)
    index["shards"][1]["bytes"] = 40000
    (d / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(ShardError, match="index does not belong to this shard"):
        list(ShardDataset(d, shuffle=False).iter_worker(0, 1))


def test_invalid_index_json_is_a_clear_error(tmp_path: Path):
    (tmp_path / INDEX_NAME).write_text("{not json")
    with pytest.raises(ShardError, match=r"index\.json: invalid index"):
        ShardDataset(tmp_path)


def _without_offsets(shards: Path, tmp_path: Path) -> Path:
    """A copy whose index lacks the image offsets, as from a tool that only records sample starts."""
    d = _copy(shards, tmp_path)
    index = read_index_doc(d)
    for s in index["shards"]:
        for k in ("image_offsets", "image_sizes", "image_exts"):
            del s[k]
    (d / INDEX_NAME).write_text(json.dumps(index))
    return d


@pytest.mark.parametrize("skip", [0, 13])
def test_reading_at_index_offsets_gives_what_parsing_the_tars_gives(
    shards: Path, tmp_path: Path, skip: int
):
    parsed = ShardDataset(_without_offsets(shards, tmp_path), seed=3)
    assert not any(s.indexed for s in parsed.index.shards)
    indexed = ShardDataset(shards, seed=3)
    assert all(s.indexed for s in indexed.index.shards)
    for worker in range(2):
        got = [(s.key, s.label, s.data) for s in indexed.iter_worker(worker, 2, skip)]
        want = [(s.key, s.label, s.data) for s in parsed.iter_worker(worker, 2, skip)]
        assert got == want and len(got) == 24 - skip


def _one_sample_dataset(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], size: int):
    """A data set of one shard holding `members`, indexed as one image `k.jpg` of `size` bytes."""
    from gpufeed.data.shards import Index, ShardEntry

    raw = _tar(members).getvalue()
    (tmp_path / "s.tar").write_bytes(raw)
    first = 512 * (1 + (len(members[0][1]) + 511) // 512) if len(members) > 1 else 0
    entry = ShardEntry("s.tar", len(raw), "", ["k"], [0], [first], [first + 512], [size], ["jpg"])
    (tmp_path / INDEX_NAME).write_bytes(Index(["c"], [entry]).to_bytes())
    return ShardDataset(tmp_path, shuffle=False)


def test_a_link_at_an_indexed_offset_is_rejected(tmp_path: Path):
    link = tarfile.TarInfo("k.jpg")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(ShardError, match="is a link"):
        list(_one_sample_dataset(tmp_path, [(link, b"")], 0).iter_worker(0, 1))


def test_a_pickle_at_an_indexed_offset_is_rejected_never_loaded(tmp_path: Path):
    members = [(tarfile.TarInfo("x.cls"), b"1"), (tarfile.TarInfo("k.pkl"), b"\x80\x04.")]
    with pytest.raises(ShardError, match="never unpickles"):
        list(_one_sample_dataset(tmp_path, members, 3).iter_worker(0, 1))


def test_an_index_size_that_disagrees_with_the_tar_header_is_detected(tmp_path: Path):
    ds = _one_sample_dataset(tmp_path, [(tarfile.TarInfo("k.jpg"), b"\xff\xd8abc")], 4)
    with pytest.raises(ShardError, match=r"s\.tar: found member 'k\.jpg' \(5 bytes\).*4 bytes"):
        list(ds.iter_worker(0, 1))


def test_a_corrupt_header_at_an_indexed_offset_is_detected(tmp_path: Path):
    ds = _one_sample_dataset(tmp_path, [(tarfile.TarInfo("k.jpg"), b"\xff\xd8abc")], 5)
    raw = bytearray((tmp_path / "s.tar").read_bytes())
    raw[3] ^= 1  # a flipped bit in the name: the header checksum no longer matches
    (tmp_path / "s.tar").write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"no valid tar header in front of 'k\.jpg'"):
        list(ds.iter_worker(0, 1))


def test_long_member_names_are_read_through_their_extension_headers(tmp_path: Path):
    from gpufeed.data.shards import Index, ShardWriter

    key = "d" * 60 + "/" + "k" * 80  # over tar's 100-byte name field
    with open(tmp_path / "s.tar", "wb") as f:
        w = ShardWriter(f, "s.tar")
        w.add(key, b"\xff\xd8long\xff\xd9", "jpg", 1)
        w.add("short", b"\xff\xd8short\xff\xd9", "jpg", 2)
        entry = w.close()
    entry.bytes = (tmp_path / "s.tar").stat().st_size
    assert entry.image_offsets[0] - entry.offsets[0] > 512
    (tmp_path / INDEX_NAME).write_bytes(Index(["c0", "c1", "c2"], [entry]).to_bytes())
    got = [
        (s.key, s.label, s.data) for s in ShardDataset(tmp_path, shuffle=False).iter_worker(0, 1)
    ]
    assert got == [(key, 1, b"\xff\xd8long\xff\xd9"), ("short", 2, b"\xff\xd8short\xff\xd9")]


def test_shards_packed_before_with_an_index_json_are_still_read(shards: Path, tmp_path: Path):
    from gpufeed.data.shards import LEGACY_INDEX_NAME

    d = _copy(shards, tmp_path)
    (d / LEGACY_INDEX_NAME).write_text(json.dumps(read_index_doc(d)))  # the version-1 lists
    (d / INDEX_NAME).unlink()
    got = sorted(s.label for s in ShardDataset(d).iter_worker(0, 1))
    assert got == list(range(48))


def test_the_index_is_numpy_columns_not_python_lists(shards: Path):
    import numpy as np

    entry = ShardDataset(shards).index.shards[0]
    for column in (entry.labels, entry.offsets, entry.image_offsets, entry.image_sizes):
        assert isinstance(column, np.ndarray) and column.dtype.itemsize <= 4
    assert entry.keys[0] == read_index_doc(shards)["shards"][0]["keys"][0]


@pytest.mark.parametrize(
    ("column", "change", "match"),
    [
        ("offsets", {"dtype": "|O"}, "column 'offsets' has no supported dtype"),
        ("image_sizes", {"data": "AAAA"}, "column 'image_sizes' holds 3 bytes, expected 48 values"),
        ("labels", {"data": "not base64!"}, "Only base64 data is allowed"),
    ],
)
def test_a_bad_index_column_is_a_clear_error(
    shards: Path, tmp_path: Path, column: str, change: dict, match: str
):
    d = _copy(shards, tmp_path)
    doc = json.loads((d / INDEX_NAME).read_text())
    doc["columns"][column].update(change)
    (d / INDEX_NAME).write_text(json.dumps(doc))
    with pytest.raises(ShardError, match=rf"gpufeed-index\.json: invalid index: .*{match}"):
        ShardDataset(d)


def test_offsets_outside_a_shard_in_the_columns_are_rejected(shards: Path, tmp_path: Path):
    import base64

    import numpy as np

    d = _copy(shards, tmp_path)
    doc = json.loads((d / INDEX_NAME).read_text())
    col = doc["columns"]["image_offsets"]
    values = np.frombuffer(base64.b64decode(col["data"]), col["dtype"]).astype("<u4")
    values[-1] = 10**9
    doc["columns"]["image_offsets"] = {"dtype": "<u4", "data": base64.b64encode(values).decode()}
    (d / INDEX_NAME).write_text(json.dumps(doc))
    with pytest.raises(ShardError, match=r"shard shard-\d+\.tar: image_offsets outside"):
        ShardDataset(d)


def test_pax_records_name_and_size_the_member_they_precede():
    # pax headers were read by a fast path (times, owners) or handed to tarfile (the rest)
    def pax_member(data: bytes, **records: str) -> tarfile.TarInfo:
        info = tarfile.TarInfo("ignored.jpg")
        info.size, info.pax_headers = len(data), records
        return info

    long = "k" * 150  # a pax `path` record: over ustar's 100-byte name field
    members = [
        (pax_member(b"A", path=f"{long}.jpg", mtime="1700000000.25", uid="7"), b"A"),
        (tarfile.TarInfo(f"{long}.cls"), b"1"),
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    assert list(iter_samples(buf, "s.tar")) == [(long, {"jpg": b"A", "cls": b"1"})]
    # a pax size stands for the header's own (which says 0 here)
    sized = tar_header("x", 10, b"x") + b"10 size=1\n".ljust(512, b"\0") + tar_header("k.jpg", 0)
    raw = sized + b"A".ljust(512, b"\0") + bytes(1024)
    assert list(iter_samples(io.BytesIO(raw), "s.tar")) == [("k", {"jpg": b"A"})]
    with pytest.raises(ShardError, match="escapes its directory"):
        list(iter_samples(_tar([(pax_member(b"x", path="../../etc/passwd"), b"x")]), "s.tar"))
