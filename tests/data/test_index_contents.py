"""What an index claims is checked when it is read (issue 38, item 8): the index `gpufeed index`
writes, edited as a hostile or broken writer would, is refused by the Loader in one ShardError
naming the index file, the shard, the field and what to do, never read as something else (a
shard's samples twice an epoch, a count rounded down, a label no class has)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from bombs import tar_of
from indexes import read_index_doc

from gpufeed.data.augment import Augment
from gpufeed.data.indexer import index_shards
from gpufeed.data.loader import Loader
from gpufeed.data.shards import INDEX_NAME, Index, ShardEntry, ShardError

SMALL = Augment(size=(16, 16))
FIX = r"; re-create it with `gpufeed pack` \(or `gpufeed index`\)$"


@pytest.fixture(scope="module")
def indexed(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 shards of 13 samples (labels 0 and 1 in turn: 2 classes), indexed by `gpufeed index`."""
    d = tmp_path_factory.mktemp("contents")
    jpgs = [p.read_bytes() for p in sorted(image_folder.glob("*/*.jpg"))[:26]]
    for s in range(2):
        members = []
        for i in range(13):
            key = f"s{s}-{i:02d}"
            members += [(f"{key}.jpg", jpgs[13 * s + i]), (f"{key}.cls", str(i % 2).encode())]
        (d / f"wds-{s}.tar").write_bytes(tar_of(members))
    assert index_shards(d, progress=False).samples == 26
    return d


@pytest.fixture
def data_set(indexed: Path, tmp_path: Path) -> Callable[[bytes], Path]:
    """`data_set(index_bytes)`: a copy of the indexed data set whose index is those bytes."""

    def make(index: bytes) -> Path:
        d = tmp_path / "copy"
        d.mkdir()
        for shard in indexed.glob("*.tar"):
            (d / shard.name).symlink_to(shard)
        (d / INDEX_NAME).write_bytes(index)
        return d

    return make


def _refused(d: Path, said: str) -> None:
    """The Loader refuses data set `d` when made, in one ShardError naming its index and `said`."""
    where = str(d / INDEX_NAME).replace(".", r"\.")
    with pytest.raises(ShardError, match=rf"^{where}: invalid index: {said}{FIX}"):
        Loader(d, 4, augment=SMALL, num_workers=0).close()


def test_the_index_as_written_is_read(indexed: Path, data_set):
    d = data_set((indexed / INDEX_NAME).read_bytes())
    with Loader(d, 4, augment=SMALL, num_workers=0, drop_last=False) as loader:
        assert sum(len(y) for _, y in loader) == 26


@pytest.mark.parametrize("version", [1, 2])
def test_a_shard_listed_twice_is_refused_not_read_twice_an_epoch(
    indexed: Path, data_set, version: int
):
    # its 13 samples were delivered twice an epoch
    index = Index.from_bytes((indexed / INDEX_NAME).read_bytes(), "test")
    twice = Index(index.classes, [*index.shards, index.shards[0]]).to_bytes(version=version)
    _refused(
        data_set(twice),
        r"shard wds-0\.tar is listed twice \(entries 0 and 2\): its samples would be read twice "
        "an epoch",
    )


@pytest.mark.parametrize(
    "field, change, shown",
    [
        ("bytes", lambda n: n + 0.5, r"\d+\.5"),
        ("bytes", str, r"'\d+'"),
        ("bytes", lambda n: True, "True"),
        ("samples", lambda n: n - 0.5, r"12\.5"),
        ("samples", lambda n: -1, "-1"),
        ("keys_size", lambda n: n + 0.25, r"\d+\.25"),
    ],
    ids=["bytes fractional", "bytes as text", "bytes true", "samples fractional",
         "samples negative", "keys_size fractional"],
)  # fmt: skip
def test_a_count_that_is_no_whole_number_is_refused_naming_shard_and_field(
    indexed: Path, data_set, field: str, change: Callable[[int], object], shown: str
):
    # bytes 71680.5 was read as 71680 (int() rounds down), "71680" and true as numbers
    doc = json.loads((indexed / INDEX_NAME).read_text())
    doc["shards"][1][field] = change(doc["shards"][1][field])
    _refused(
        data_set(json.dumps(doc).encode()),
        rf"shard wds-1\.tar: {field} is {shown}, not a whole number of 0 or more",
    )


@pytest.mark.parametrize(
    "column, value", [("labels", 1.5), ("offsets", 512.5), ("image_sizes", "99"), ("bytes", 7.5)]
)
def test_a_version_1_index_of_fractions_is_refused(
    indexed: Path, data_set, column: str, value: object
):
    doc = read_index_doc(indexed)
    if column == "bytes":
        doc["shards"][0]["bytes"] = value
        said = r"shard wds-0\.tar: bytes is 7\.5, not a whole number of 0 or more"
    else:
        doc["shards"][0][column][3] = value
        said = rf"shard wds-0\.tar: {column} holds {value!r}, not a whole number"
    _refused(data_set(json.dumps(doc).encode()), said)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "label, why",
    [
        (-3, "a class id is never negative"),
        (7, "the index lists 2 classes, ids 0 to 1"),
        (2, "the index lists 2 classes, ids 0 to 1"),
    ],
)
def test_a_label_that_is_no_class_id_is_refused_naming_shard_and_sample(
    indexed: Path, data_set, label: int, why: str, version: int
):
    # label -3, and label 7 of 2 classes, reached training (a CUDA assert in the loss, at best)
    doc = read_index_doc(indexed)
    doc["shards"][1]["labels"][4] = label
    data = json.dumps(doc).encode()
    if version == 2:  # by columns, as `gpufeed index` writes it
        data = Index(doc["classes"], [ShardEntry.from_json(s) for s in doc["shards"]]).to_bytes()
    _refused(
        data_set(data),
        rf"shard wds-1\.tar: sample 4 \('s1-04'\) has label {label}, not a class id: {why}",
    )
