"""What `--data` names: a pre-resized sample packed from an image folder, however it is spelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.advise.inputs import pack_sample
from gpufeed.data.dataset import ShardDataset
from gpufeed.demo.synth import make_image_folder


def test_a_sample_of_a_folder_given_by_a_relative_path_is_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    make_image_folder(tmp_path / "imgs", 12, 2)
    monkeypatch.chdir(tmp_path)
    shards = pack_sample("imgs", tmp_path / "sample", image_size=32, n=8)
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))
    assert len(samples) == 8 and {s.label for s in samples} == {0, 1}
