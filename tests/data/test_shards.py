"""The shard format: WebDataset-compatible tars, and safe, clear failures on bad shards."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.shards import INDEX_NAME, ShardError, iter_samples


def test_webdataset_reads_the_shards_we_write(shards: Path):
    import webdataset as wds

    index = json.loads((shards / INDEX_NAME).read_text())
    urls = [str(shards / s["name"]) for s in index["shards"]]
    got = {s["__key__"]: int(s["cls"]) for s in wds.WebDataset(urls, shardshuffle=False)}
    want = {k: lab for s in index["shards"] for k, lab in zip(s["keys"], s["labels"], strict=True)}
    assert got == want
    one = next(iter(wds.WebDataset(urls[:1], shardshuffle=False).decode("rgb8")))
    assert one["jpg"].ndim == 3 and one["jpg"].shape[2] == 3


def test_index_offsets_point_at_each_image(shards: Path):
    index = json.loads((shards / INDEX_NAME).read_text())
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
    index = json.loads((d / INDEX_NAME).read_text())
    index["shards"][1]["bytes"] = 40000
    (d / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(ShardError, match="index does not belong to this shard"):
        list(ShardDataset(d, shuffle=False).iter_worker(0, 1))


def test_invalid_index_json_is_a_clear_error(tmp_path: Path):
    (tmp_path / INDEX_NAME).write_text("{not json")
    with pytest.raises(ShardError, match=r"index\.json: invalid index"):
        ShardDataset(tmp_path)
