"""Text that came from data never reaches a terminal raw: a sample key, a path or a file name with
ESC/OSC sequences (set the window title, clear the screen) is shown escaped in the Loader's
warnings and errors, `pack`'s messages and the commands' lines, as `show` and `ls` show it."""

from __future__ import annotations

import io
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest

from gpufeed.commands.report import write_report
from gpufeed.commands.trace import write_trace
from gpufeed.data.augment import Augment
from gpufeed.data.indexer import index_shards
from gpufeed.data.loader import Loader
from gpufeed.data.packing import PackError, pack
from gpufeed.data.sample_extras import MissingMember
from gpufeed.demo.synth import make_image_folder

# sets the window title, rings the bell, clears the screen; then a right-to-left override
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\u202e"
SHOWN = "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202e"


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c in "\x1b\x07\x9b\u202e"]


@pytest.fixture(scope="module")
def hostile_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One indexed WebDataset shard: 5 good JPEGs with a .json member, then a truncated one
    without, whose key holds `HOSTILE`."""
    images = sorted(
        make_image_folder(tmp_path_factory.mktemp("img"), 6, 1, short_side=(32, 40)).rglob("*.jpg")
    )
    out = tmp_path_factory.mktemp("hostile")
    samples = [(f"good{i:02d}", p.read_bytes()) for i, p in enumerate(images[:5])]
    data = images[5].read_bytes()
    samples.append((f"z{HOSTILE}", data[: len(data) // 2]))  # header reads, scan data cut short
    with tarfile.open(out / "shard-000.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for key, jpeg in samples:
            members = [("jpg", jpeg), ("cls", b"0")]
            members += [("json", b'{"id": 1}')] if key.startswith("good") else []
            for ext, payload in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    index_shards(str(out), progress=False)
    return out


def _loader(shards: Path, batch_size: int, **options: Any) -> Loader:
    """An unshuffled Loader in the training process itself, over `shards`."""
    return Loader(
        shards,
        batch_size,
        num_workers=0,
        device="cpu",
        augment=Augment(size=(16, 16)),
        shuffle=False,
        **options,
    )


def test_loader_corrupt_sample_warning_shows_the_key_escaped(hostile_shards: Path) -> None:
    loader = _loader(hostile_shards, 3)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in loader:
                pass
    finally:
        loader.close()
    (said,) = [str(w.message) for w in caught if "corrupt" in str(w.message)]
    assert _raw_controls(said) == []
    assert SHOWN in said
    assert loader.stats()["corrupt"] == 1


def test_missing_member_error_shows_the_key_escaped(hostile_shards: Path) -> None:
    loader = _loader(hostile_shards, 6, extras=("json",))
    try:
        with pytest.raises(MissingMember) as raised, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in loader:
                pass
    finally:
        loader.close()
    message = str(raised.value)
    assert "has no .json member" in message and _raw_controls(message) == []
    assert SHOWN in message


def test_pack_messages_show_paths_escaped(tmp_path: Path) -> None:
    with pytest.raises(PackError) as raised:
        pack(f"s3://bucket/{HOSTILE}", tmp_path / "out", progress=False)
    assert _raw_controls(str(raised.value)) == [] and SHOWN in str(raised.value)
    src = tmp_path / HOSTILE
    src.mkdir()
    with pytest.raises(PackError) as raised:
        pack(src, src / "shards", progress=False)
    assert _raw_controls(str(raised.value)) == [] and SHOWN in str(raised.value)


def test_report_and_trace_lines_show_paths_escaped(make_run, tmp_path: Path) -> None:
    run_dir = make_run(ranks={0: [(i, 1000.0 + i, 1000.9 + i, 0.1, 8, None) for i in range(5)]})
    said: list[str] = []
    write_report(run_dir, out=tmp_path / f"{HOSTILE}.html", echo=said.append)
    write_trace(run_dir, out=tmp_path / f"{HOSTILE}.json", echo=said.append)
    assert len(said) == 2
    for line in said:
        assert _raw_controls(line) == [] and SHOWN in line
