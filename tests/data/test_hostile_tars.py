"""Hostile and unusual tars (issue 38): `gpufeed index` and the Loader read shards through one
scanner with one set of rules, so what `index` accepts every Loader read path reads, and what it
refuses the Loader refuses too, in one line naming shard, member and byte, never a hang.

The tars are written byte by byte (`bombs.tar_header`) or by tarfile and GNU tar; the index is
written by the real `gpufeed index` command; the Loader decodes real JPEGs."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bombs import base256, sparse_member, tar_header, tar_member, tar_of
from indexes import legacy_copy

from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.data.shards import INDEX_NAME, Index, ShardEntry, ShardError, iter_samples

SMALL = Augment(size=(16, 16))


@pytest.fixture(scope="module")
def jpgs(image_folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(image_folder.glob("*/*.jpg"))[:8]]


def _index_cli(*args: object, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """`gpufeed index ARGS` as a user runs it."""
    cmd = [sys.executable, "-m", "gpufeed.cli", "index", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused `gpufeed index`."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpufeed: error: shard "), done.stderr
    return lines[0]


def _hand_index(d: Path, samples: list[tuple[str, int, int, int, int]]) -> None:
    """An index of shard d/s.tar written by hand (gpufeed index refuses the shard): samples as
    (key, first header, image offset, image size, label)."""
    size = (d / "s.tar").stat().st_size
    keys, starts, images, sizes, labels = (list(col) for col in zip(*samples, strict=True))
    entry = ShardEntry("s.tar", size, "", keys, labels, starts, images, sizes, ["jpg"] * len(keys))
    (d / INDEX_NAME).write_bytes(Index(["c0", "c1"], [entry]).to_bytes())


@pytest.fixture
def read_paths(tmp_path: Path) -> Iterator[Callable[[Path], dict[str, Callable[[], list]]]]:
    """`read_paths(d)`: each way the Loader reads data set d, as a callable listing
    (key, label, image bytes): at the index's offsets, whole samples (extras=), member by member
    (an index without image offsets), and the Loader decoding them (labels only)."""
    with contextlib.ExitStack() as stack:

        def paths(d: Path) -> dict[str, Callable[[], list]]:
            legacy = tmp_path / f"legacy-{d.name}"
            shutil.rmtree(legacy, ignore_errors=True)
            legacy_copy(d, legacy)

            def loader() -> list:
                kw = {"augment": SMALL, "num_workers": 0, "shuffle": False, "strict": True}
                ld = stack.enter_context(Loader(d, 2, **kw))
                return sorted(int(x) for _, y in ld for x in y)

            def raw(url: Path, **kw: object) -> Callable[[], list]:
                ds = ShardDataset(url, shuffle=False, **kw)
                return lambda: [(s.key, s.label, s.data) for s in ds.iter_worker(0, 1)]

            return {
                "at offsets": raw(d),
                "whole samples": raw(d, extras=("__key__", "cls")),
                "member by member": raw(legacy),
                "decoded": loader,
            }

        yield paths


# --- item 2: a size no shard can hold ------------------------------------------------------------


@pytest.mark.parametrize(
    "field, says",
    [
        (base256(2**62), r"member 'b\.jpg' at byte {at} claims 4,611,686,018,427,387,904 bytes in "
         r"base-256"),
        (b"77777777777\0", r"is truncated at byte \d+: it ends inside member 'b\.jpg', whose header "
         r"at byte {at} claims 8,589,934,591 bytes where [\d,]+ are left"),
    ],
    ids=["base-256", "octal, past the end"],
)  # fmt: skip
def test_a_size_past_the_shard_is_refused_at_once_by_index_and_loader(
    tmp_path: Path, jpgs: list[bytes], read_paths, field: bytes, says: str
):
    # base-256 (0x80 + 2^62): `gpufeed index` read on block by block, killed at 120 s twice
    d = tmp_path / "big"
    d.mkdir()
    a = tar_member("a.jpg", jpgs[0]) + tar_member("a.cls", b"0")
    (d / "s.tar").write_bytes(a + tar_header("b.jpg", size_field=field) + jpgs[1] + bytes(4096))
    said = says.format(at=len(a))
    start = time.monotonic()
    line = _refused(_index_cli(d / "s.tar", timeout=90))  # TimeoutExpired: it spun
    assert time.monotonic() - start < 60
    assert line.startswith(f"gpufeed: error: shard {d / 's.tar'}") and re.search(said, line), line
    assert not (d / INDEX_NAME).exists()
    # an index written by hand for it: every read path refuses it, as `index` does
    _hand_index(d, [("a", 0, 512, len(jpgs[0]), 0), ("b", len(a), len(a) + 512, len(jpgs[1]), 1)])
    for read in read_paths(d).values():
        with pytest.raises(ShardError, match=said):
            read()


# --- item 7: index and Loader agree ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, named",
    [(b"S", "a GNU sparse file"), (b"3", "a character device"), (b"6", "a FIFO")],
)
def test_what_is_not_a_regular_file_is_refused_by_index_and_loader_alike(
    tmp_path: Path, jpgs: list[bytes], read_paths, kind: bytes, named: str
):
    # a GNU sparse member was indexed (exit 0), then refused by the Loader
    d = tmp_path / "odd"
    d.mkdir()
    a = tar_member("a.jpg", jpgs[0]) + tar_member("a.cls", b"0")
    b = sparse_member("b.jpg", jpgs[1]) if kind == b"S" else tar_header("b.jpg", 0, kind)
    (d / "s.tar").write_bytes(a + b + tar_member("b.cls", b"1") + b"\0" * 10240)
    line = _refused(_index_cli(d / "s.tar"))
    said = rf"s\.tar: member 'b\.jpg' at byte {len(a)} is {named}, not a regular file; rejected"
    assert re.search(said, line), line
    _hand_index(d, [("a", 0, 512, len(jpgs[0]), 0), ("b", len(a), len(a) + 512, len(jpgs[1]), 1)])
    for read in read_paths(d).values():
        with pytest.raises(ShardError, match=said):
            read()


def test_tars_joined_end_to_end_are_read_whole_by_index_and_loader(
    tmp_path: Path, jpgs: list[bytes], read_paths
):
    # `cat a.tar b.tar` indexed 2 of 4 samples with exit 0 (and the Loader refused the shard)
    d = tmp_path / "cat"
    d.mkdir()
    first = tar_of([("a.jpg", jpgs[0]), ("a.cls", b"0"), ("b.jpg", jpgs[1]), ("b.cls", b"1")])
    second = tar_of([("c.jpg", jpgs[2]), ("c.cls", b"0"), ("d.jpg", jpgs[3]), ("d.cls", b"1")])
    (d / "s.tar").write_bytes(first + second)
    with tarfile.open(d / "s.tar", ignore_zeros=True) as tar:  # as `tar --ignore-zeros` reads it
        assert len(tar.getnames()) == 8
    done = _index_cli(d / "s.tar")
    assert done.returncode == 0, done.stderr
    assert "indexed 4 samples of 2 classes in 1 shard" in done.stdout
    want = [
        (k, lab, jpgs[i]) for i, (k, lab) in enumerate([("a", 0), ("b", 1), ("c", 0), ("d", 1)])
    ]
    for path, read in read_paths(d).items():
        assert read() == (sorted(lab for _, lab, _ in want) if path == "decoded" else want), path


@pytest.mark.parametrize(
    "names, said",
    [
        (
            ["a.jpg", "a.cls", "k.jpg", "k.cls", "k.jpg", "k.cls", "b.jpg", "b.cls"],
            r"s\.tar: sample 'k' has member 'k\.jpg' twice \(at bytes \d+ and \d+\)",
        ),
        (
            ["k.jpg", "k.cls", "b.jpg", "b.cls", "k.jpg", "k.cls"],
            r"s\.tar: key 'k' at byte \d+ names a sample already read \(at byte 0\)",
        ),
    ],
    ids=["in a row", "after another sample"],
)
def test_a_key_repeated_is_refused_never_four_images_made_three_samples(
    tmp_path: Path, jpgs: list[bytes], names: list[str], said: str
):
    # k.jpg, k.cls, k.jpg: 4 images became 3 samples, silently
    d = tmp_path / "dup"
    d.mkdir()
    members = [(n, jpgs[i] if n.endswith(".jpg") else b"1") for i, n in enumerate(names)]
    (d / "s.tar").write_bytes(tar_of(members))
    line = _refused(_index_cli(d / "s.tar"))
    assert re.search(said, line) and "give every sample its own key" in line, line
    assert not (d / INDEX_NAME).exists()
    # the Loader's member-by-member read groups members by the same rule
    with pytest.raises(ShardError, match=said), open(d / "s.tar", "rb") as f:
        list(iter_samples(f, str(d / "s.tar")))


# --- one scanner: what index accepts, every read path reads ---------------------------------------


def _unusual(kind: str, jpgs: list[bytes], out: Path) -> list[tuple[str, int]]:
    """Write shard out/s.tar of an unusual but valid kind; its (key, label)s in order."""
    keys = {
        "GNU long names": [("d" * 110 + str(i), i % 2) for i in range(3)],
        "pax path records": [("p" * 120 + "é" + str(i), i % 2) for i in range(3)],
        "ustar prefix": [("folder" * 20 + f"/k{i}", i % 2) for i in range(3)],
        "folder entries": [(f"sub/k{i}", i % 2) for i in range(3)],
        "pax global header": [(f"g{i}", i % 2) for i in range(3)],
        "contiguous files": [(f"c{i}", i % 2) for i in range(3)],
    }[kind]
    fmt = {"GNU long names": tarfile.GNU_FORMAT, "ustar prefix": tarfile.USTAR_FORMAT}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt.get(kind, tarfile.PAX_FORMAT)) as tar:
        if kind == "folder entries":
            folder = tarfile.TarInfo("sub")
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
        for i, (key, label) in enumerate(keys):
            for name, data in ((f"{key}.jpg", jpgs[i]), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1700000000.5  # a pax mtime record, as wds
                if kind == "contiguous files":
                    info.type = tarfile.CONTTYPE
                tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    if kind == "pax global header":  # as `git archive` writes: a commit id for the whole tar
        record = b"52 comment=0123456789abcdef0123456789abcdef01234567\n"
        raw = tar_header("pax_global_header", len(record), b"g") + record.ljust(512, b"\0") + raw
    (out / "s.tar").write_bytes(raw)
    return keys


@pytest.mark.parametrize(
    "kind",
    [
        "GNU long names",
        "pax path records",
        "ustar prefix",
        "folder entries",
        "pax global header",
        "contiguous files",
    ],
)
def test_what_index_accepts_every_read_path_reads(
    tmp_path: Path, jpgs: list[bytes], read_paths, kind: str
):
    d = tmp_path / "unusual"
    d.mkdir()
    keys = _unusual(kind, jpgs, d)
    done = _index_cli(d / "s.tar")
    assert done.returncode == 0, done.stderr
    want = [(k, lab, jpgs[i]) for i, (k, lab) in enumerate(keys)]
    for path, read in read_paths(d).items():
        assert read() == (sorted(lab for _, lab in keys) if path == "decoded" else want), path


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")
@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_shards_gnu_tar_writes_are_indexed_and_read_by_every_path(
    tmp_path: Path, jpgs: list[bytes], read_paths, fmt: str
):
    tree = tmp_path / "tree"
    keys = [(f"{'n' * 90}/{'k' * 40}{i}", i % 2) for i in range(4)]  # paths over 100 bytes
    for i, (key, label) in enumerate(keys):
        (tree / key).parent.mkdir(parents=True, exist_ok=True)
        (tree / f"{key}.jpg").write_bytes(jpgs[i])
        (tree / f"{key}.cls").write_text(str(label))
    d = tmp_path / fmt
    d.mkdir()
    names = [f"{k}.{e}" for k, _ in keys for e in ("jpg", "cls")]
    subprocess.run(
        ["tar", f"--format={fmt}", "-C", str(tree), "-cf", str(d / "s.tar"), *names], check=True
    )
    assert _index_cli(d / "s.tar").returncode == 0
    want = [(k, lab, jpgs[i]) for i, (k, lab) in enumerate(keys)]
    for path, read in read_paths(d).items():
        assert read() == (sorted(lab for _, lab in keys) if path == "decoded" else want), path
