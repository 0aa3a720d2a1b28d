"""What `--data` names: a pre-resized sample packed from an image folder, however it is spelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.advise.inputs import pack_sample, resolve_data
from gpufeed.advise.measure import MeasureError
from gpufeed.data.dataset import ShardDataset
from gpufeed.demo.synth import make_image_folder


def test_a_sample_of_a_folder_given_by_a_relative_path_is_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    make_image_folder(tmp_path / "imgs", 12, 2)
    monkeypatch.chdir(tmp_path)
    shards = pack_sample("imgs", tmp_path / "sample", image_size=32, n=8).shards
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))
    assert len(samples) == 8 and {s.label for s in samples} == {0, 1}


def test_a_corrupt_image_in_the_sample_is_left_out_and_named_as_the_user_spelled_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    images = make_image_folder(tmp_path / "imgs", 12, 2)
    bad = sorted(images.glob("*/*.jpg"))[0]
    bad.write_bytes(b"\xff\xd8 not a jpeg")
    monkeypatch.chdir(tmp_path)
    sample = pack_sample("imgs", tmp_path / "sample", image_size=32, n=12)
    samples = list(ShardDataset(sample.shards, shuffle=False).iter_worker(0, 1))
    assert len(samples) == 11
    assert [p for p, _ in sample.skipped] == [str(Path("imgs") / bad.relative_to(images))]
    assert sample.left_out().startswith(f"1 sampled file left out: imgs/{bad.parent.name}/")


def test_a_clean_sample_says_nothing_left_out(tmp_path: Path):
    sample = pack_sample(str(make_image_folder(tmp_path / "imgs", 4, 2)), tmp_path / "s", 32)
    assert sample.skipped == [] and sample.left_out() == ""


def test_a_folder_with_no_readable_image_is_refused_by_its_own_name(tmp_path: Path):
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    with pytest.raises(MeasureError, match=r"no images found: expected .*/imgs/<class>/<image>"):
        pack_sample(str(tmp_path / "imgs"), tmp_path / "s", 32)
    for i in range(3):
        (tmp_path / "imgs" / "a" / f"{i}.jpg").write_text("not a jpeg")
    with pytest.raises(MeasureError) as e:
        pack_sample(str(tmp_path / "imgs"), tmp_path / "s2", 32)
    message = str(e.value)
    assert "none of the 3 files sampled from it is a readable image (e.g. " in message
    assert str(tmp_path / "s2") not in message  # not the temporary list file it packed from


@pytest.mark.parametrize("url", ["s3://bucket/shards", "gs://bucket/a/b"])
def test_a_url_names_remote_shards_not_a_module_and_function(url: str):
    spec = resolve_data(url)  # the Loader reads (and checks) them; nothing is imported
    assert (spec.kind, spec.where, spec.loader) == ("shards", url, None)
