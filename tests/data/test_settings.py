"""Loader settings files: what `gpufeed tune` writes is read back as Loader keyword arguments;
a bad file is refused naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufeed.data import load_settings
from gpufeed.data.settings import SettingsError

GOOD = {"batch_size": 8, "num_workers": 1, "prefetch": 2, "preprocess": "cpu"}


def test_a_settings_file_reads_back_as_loader_arguments(tmp_path: Path):
    path = tmp_path / "s.json"
    crop_boxes = {**GOOD, "decoder": "nvimgcodec"}
    path.write_text(json.dumps({"loader": crop_boxes, "trials": []}))
    assert load_settings(path) == crop_boxes


def test_a_file_written_before_the_decoder_setting_reads_back_with_the_default_decoder(
    tmp_path: Path,
):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"loader": GOOD}))
    assert load_settings(path) == {**GOOD, "decoder": "auto"}


def test_workers_tuned_for_more_cores_per_rank_than_here_become_the_default_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from gpufeed.cores import cores_per_rank
    from gpufeed.data.loader import default_workers

    path = tmp_path / "s.json"
    here = cores_per_rank()
    path.write_text(json.dumps({"loader": {**GOOD, "num_workers": 15}, "cores_per_rank": 16}))
    if here != 16:  # tuned on a 16-core machine: 15 workers would oversubscribe this one
        with pytest.warns(RuntimeWarning, match="tuned for 16 cores per training process"):
            assert load_settings(path)["num_workers"] == default_workers()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # the same file under torchrun, 8 ranks here
    with pytest.warns(RuntimeWarning, match=f"this one has {cores_per_rank()}"):
        assert load_settings(path)["num_workers"] == default_workers()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    old = tmp_path / "old.json"  # written before tune recorded cores_per_rank
    old.write_text(json.dumps({"loader": {**GOOD, "num_workers": cores_per_rank()}}))
    assert load_settings(old)["num_workers"] == cores_per_rank()  # as many as the cores: kept
    old.write_text(json.dumps({"loader": {**GOOD, "num_workers": cores_per_rank() + 1}}))
    with pytest.warns(RuntimeWarning, match="is more than the"):
        assert load_settings(old)["num_workers"] == default_workers()
    mine = tmp_path / "mine.json"  # tuned here for this many ranks: kept, whatever it is
    mine.write_text(
        json.dumps({"loader": {**GOOD, "num_workers": 40}, "cores_per_rank": cores_per_rank()})
    )
    assert load_settings(mine)["num_workers"] == 40


def test_the_old_import_path_still_works_and_says_where_it_moved(tmp_path: Path):
    from gpufeed.bench.tune import load_settings as old

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"loader": GOOD}))
    with pytest.warns(DeprecationWarning, match=r"use gpufeed\.data\.load_settings"):
        assert old(path) == {**GOOD, "decoder": "auto"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such settings file"),
        ("{not json", "not a readable JSON settings file"),
        ('{"x": 1}', "no 'loader' object"),
        ('{"loader": {"batch_size": 8}}', "missing keys"),
        (
            '{"loader": {"batch_size": 8, "num_workers": -1, "prefetch": 2, "preprocess": "cpu"}}',
            "loader.num_workers = -1",
        ),
        (
            '{"loader": {"batch_size": 8, "num_workers": 1, "prefetch": 2, "preprocess": "tpu"}}',
            "loader.preprocess = 'tpu'",
        ),
        (
            '{"loader": {"batch_size": 8, "num_workers": 1, "prefetch": 2, "preprocess": "cpu", '
            '"decoder": "turbo"}}',
            "loader.decoder = 'turbo': use one of auto, dali, nvimgcodec",
        ),
    ],
)
def test_a_bad_settings_file_is_refused_naming_the_file(tmp_path: Path, content, message):
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError, match=message) as e:
        load_settings(path)
    assert str(path) in str(e.value)
