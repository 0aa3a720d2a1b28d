"""`gpufeed tune`: measured trials from the Loader's defaults, a winner at least as fast as them,
an early stop once the loader outruns the model, and a settings file the Loader reads back."""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from gpufeed.advise.measure import MeasureError
from gpufeed.advise.tune import GPU_ALONE_NOTE, Trial, TuneResult, _worker_counts, tune
from gpufeed.cores import usable_cores
from gpufeed.data import load_settings
from gpufeed.data.augment import Augment
from gpufeed.data.budget import machine_memory
from gpufeed.data.loader import Loader, default_workers
from gpufeed.data.packing import pack
from gpufeed.demo.synth import make_image_folder
from gpufeed.extras import installed
from gpufeed.present.numbers import count

THIS = __file__


class _Sluggish(nn.Module):
    """A model that takes 0.2 s per step whatever the batch: any loader outruns it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.2)
        return self.fc(x.mean((2, 3)))


def sluggish_model() -> nn.Module:
    return _Sluggish()


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    images = make_image_folder(tmp_path_factory.mktemp("img"), 96, 4, short_side=(300, 400))
    out = tmp_path_factory.mktemp("shards")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny shards, below the 1-128 MB advice
        pack(images, out, progress=False, workers=1)
    return out


def test_tune_finds_settings_at_least_as_fast_as_the_defaults(shards: Path, tmp_path: Path):
    out = tmp_path / "tune.json"
    r = tune(
        str(shards), batch_size=16, device="cpu", image_size=32, allow_batch_change=True,
        out=out, seconds=1.0, repeats=2,
    )  # fmt: skip
    default = r.trials[0]
    assert (default.num_workers, default.prefetch, default.preprocess) == (
        default_workers(),
        2,
        "cpu",
    )
    assert len(r.trials) >= 5 and not r.stopped_early
    assert {t.num_workers for t in r.trials} >= {0, 1, usable_cores()}
    assert {t.batch_size for t in r.trials} == {8, 16, 32}
    # where nvImageCodec is installed, the workers' crop-box decode is one more trial
    assert any(t.decoder == "nvimgcodec" for t in r.trials) is installed("nvimgcodec")
    assert all(t.images_per_s > 0 and t.spread >= 0 for t in r.trials)  # 2 repeats each
    assert r.best.images_per_s >= default.images_per_s
    # the fastest of the trials ahead of the default by more than their noise, else the default
    ahead = [
        t for t in r.trials
        if t.images_per_s > default.images_per_s * (1 + max(t.spread, default.spread) / 2)
    ]  # fmt: skip
    assert r.best == max(ahead, key=lambda t: t.images_per_s, default=default)

    settings = load_settings(out)
    assert settings == r.best.settings()
    doc = json.loads(out.read_text())
    assert doc["default_images_per_s"] == pytest.approx(default.images_per_s)
    assert len(doc["trials"]) == len(r.trials) and doc["notes"] == r.notes
    # the file is directly usable as Loader keyword arguments
    loader = Loader(shards, **settings, augment=Augment(size=(32, 32)))
    images, _ = next(iter(loader))
    assert images.shape[1:] == (3, 32, 32) and images.shape[0] <= settings["batch_size"]


def test_tune_stops_as_soon_as_the_loader_outruns_the_model(
    shards: Path, capfd: pytest.CaptureFixture[str]
):
    r = tune(
        str(shards), model=f"{THIS}:sluggish_model", batch_size=16, device="cpu", image_size=32,
        out=None, seconds=1.0, repeats=1,
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert out == "" and "trial 1:" in err  # returned, not printed; progress on stderr
    assert r.model_images_per_s is not None and r.model_images_per_s < 16 / 0.2 * 1.01
    # measured end to end (the model trained on the loader's batches), the search stops at the
    # first trial that keeps the model fed: usually the defaults, on a busy machine a later one
    assert r.stopped_early and r.trials[-1].data_wait_share < 0.1
    assert all(t.data_wait_share >= 0.1 for t in r.trials[:-1])
    assert r.trials[-1].images_per_s <= r.model_images_per_s * 1.2
    # the offload advice costs an image's CPU from the best trial's loader alone, not from its
    # end-to-end rate, which the sleeping model holds down
    assert "measuring the loader alone" in err
    best = r.best
    assert r.offload is not None
    assert r.offload.cpu_s_per_image < 0.5 * max(1, best.num_workers) / best.images_per_s
    assert "not needed" in r.offload.text()
    # the model alone trains with the threads the best trial's workers leave it, as it did there
    threads = max(1, usable_cores() - best.num_workers)
    alone = f"measuring the model alone: {THIS}:sluggish_model on cpu, {count(threads, 'thread')}"
    assert alone in " ".join(err.split())  # as one line, however the terminal wrapped it


def test_the_candidate_worker_counts_double_with_half_steps_up_to_the_most():
    assert _worker_counts(1) == [0, 1]
    assert _worker_counts(2) == [0, 1, 2]
    assert _worker_counts(15) == [0, 1, 2, 4, 8, 12, 15]  # 16 cores on CUDA: the default, 15
    assert _worker_counts(64) == [0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64]


@pytest.mark.parametrize("load", [0, 2])
def test_every_trial_augments_as_asked_and_the_file_and_title_say_how(
    shards: Path, tmp_path: Path, loader_recipes: list, load: int
):
    import io

    from rich.console import Console

    out = tmp_path / "tune.json"
    r = tune(
        str(shards), batch_size=16, device="cpu", image_size=32, out=out, seconds=0.3, repeats=1,
        augment_load=load, progress=False,
    )  # fmt: skip
    want = Augment(size=(32, 32)) if load == 0 else Augment.load_factor(load, size=(32, 32))
    assert len(loader_recipes) >= len(r.trials) and all(a == want for a in loader_recipes)
    assert json.loads(out.read_text())["augment_load"] == load
    text = io.StringIO()
    Console(file=text, width=100).print(r)
    title = "ImageNet recipe (crop, flip)" if load == 0 else f"augmentation load {load}"
    assert f"gpufeed tune: {shards} · {title}" in text.getvalue()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_heavy_recipe_also_tries_the_workers_and_gpu_split(shards: Path):
    r = tune(
        str(shards), batch_size=16, device="cuda", image_size=32, out=None, seconds=0.5,
        repeats=1, augment_load=3, progress=False,
    )  # fmt: skip
    split = [t for t in r.trials if t.decoder == "workers"]
    assert [t.preprocess for t in split] == ["gpu"] and split[0].images_per_s > 0
    # no model: a GPU decoder's rate alone hides what it takes from training, and the note says so
    decodes_on_gpu = r.best.preprocess == "gpu" and r.best.decoder != "workers"
    assert (GPU_ALONE_NOTE in r.notes) == decodes_on_gpu
    # the light recipe has no warps left for the GPU: no such trial
    light = tune(
        str(shards), batch_size=16, device="cuda", image_size=32, out=None, seconds=0.5,
        repeats=1, augment_load=1, progress=False,
    )  # fmt: skip
    assert all(t.decoder != "workers" for t in light.trials)


def test_a_trial_refused_by_a_limit_is_skipped_and_said_why(shards: Path):
    # uint8 batches of an eighth of the machine's memory: they could fit once (6 batches' worth,
    # the least a loader holds), but a worker's 3 slots are over the loader's cap (a quarter)
    batch = math.ceil(machine_memory() / 8 / (3 * 512 * 512))
    with pytest.raises(MeasureError, match=r"every trial was skipped: skipped .*max_host_bytes"):
        tune(str(shards), batch_size=batch, device="cpu", image_size=512, out=None, seconds=0.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "mytrain:make_loader"], "tune searches the gpufeed Loader"),
        (["--data", "/no/such/shards"], "--data /no/such/shards: no such directory"),
        (["--data", ".", "--out", "/no/such/dir/t.json"], "folder /no/such/dir does not exist"),
        (["--data", ".", "--out", "."], "--out . is a folder: give a file name"),
        (["--data", ".", "--model", "resnet9"], "--model 'resnet9' is not known"),
        (["--data", ".", "--augment-load", "-2"], "--augment-load -2: must be 0 or more"),
        (["--data", ".", "--augment-load", "100000"], "--augment-load 100000: must be 64 or less"),
    ],
)
def test_bad_input_exits_2_naming_the_option(args: list[str], message: str):
    from typer.testing import CliRunner

    from gpufeed.cli import app

    res = CliRunner().invoke(app, ["tune", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output.replace("\n", "")


def test_one_repeat_shows_no_spread_and_the_file_is_strict_json(shards: Path, tmp_path: Path):
    out = tmp_path / "tune.json"
    r = tune(
        str(shards), batch_size=16, device="cpu", image_size=32, out=out, seconds=0.5, repeats=1
    )

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    doc = json.loads(out.read_text(), parse_constant=refuse)  # no NaN, which strict parsers refuse
    assert all(math.isnan(t.spread) for t in r.trials)
    assert all(t["spread"] is None and t["data_wait_share"] is None for t in doc["trials"])
    assert [t["images_per_s"] for t in doc["trials"]] == [t.images_per_s for t in r.trials]


def test_a_tune_result_prints_itself_with_rich():
    """What `gpufeed tune` prints at the end is the returned TuneResult, rendered by itself."""
    from rich.console import Console

    from gpufeed.advise.tune import Trial, TuneResult

    trials = [Trial(64, 1, 2, "cpu", 100.0, "default"), Trial(64, 4, 2, "cpu", 300.0)]
    # run strings are printed as they are, never read as markup
    note = r"skipped 8 workers: [bold]max_host_bytes[/] too small for C:\data\\"
    r = TuneResult("data[1]", "cpu", 224, trials, out=Path("gpufeed-tune.json"), notes=[note])
    console = Console(record=True, width=300)
    console.print(r)
    out = console.export_text()
    assert "gpufeed tune: data[1]" in out and "← best" in out and "×3.00" in out
    assert "settings written to gpufeed-tune.json" in out
    assert note in out


@pytest.mark.parametrize("gpu", [False, True])
def test_the_result_fits_an_80_column_terminal_without_cutting_a_figure(gpu: bool):
    from rich.console import Console

    from gpufeed.advise.tune import Trial, TuneResult

    trials = [
        Trial(256, 15, 2, "cpu", 2394.6, "default", spread=0.02),
        Trial(512 if gpu else 256, 15, 8, "gpu" if gpu else "cpu", 12919.7, spread=0.24),
    ]
    console = Console(record=True, width=80)
    console.print(TuneResult("/data/train", "cuda", 224, trials))
    out = console.export_text()
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    assert "2,395" in out and "12,920" in out and "±12%" in out and "×5.40" in out
    assert "default" in out and "← best" in out
    # a setting every trial shares is said once, above the table
    assert ("· batch 256 · preprocess cpu" in out) is not gpu


def test_a_decoder_that_varies_gets_its_column_and_still_fits_80_columns():
    from rich.console import Console

    from gpufeed.advise.tune import Trial, TuneResult

    trials = [
        Trial(256, 15, 2, "cpu", 2394.6, "default", spread=0.02),
        Trial(256, 15, 8, "cpu", 2719.3, spread=0.04, decoder="nvimgcodec"),
    ]
    console = Console(record=True, width=80)
    console.print(TuneResult("/data/train", "cuda", 224, trials))
    out = console.export_text()
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    assert "decoder" in out and "nvimgcodec" in out and "auto" in out and "×1.14" in out


def test_a_lead_within_the_noise_of_the_repeats_keeps_the_default():
    default = Trial(64, 15, 2, "cpu", 1000.0, "default", spread=0.10)
    noisy = Trial(64, 15, 4, "cpu", images_per_s=1040.0, spread=0.06)  # +4%, within 5%
    clear = Trial(64, 12, 2, "cpu", images_per_s=1080.0, spread=0.04)  # +8%
    assert TuneResult("d", "cuda", 224, [default, noisy]).best == default
    assert TuneResult("d", "cuda", 224, [default, noisy, clear]).best == clear
    # trained end to end: the trial that ends the default's data wait wins (the search stops
    # there), though its lead is within the noise
    waiting = Trial(64, 1, 2, "cpu", 100.0, "default", spread=0.4, data_wait_share=0.3)
    fed = Trial(64, 8, 2, "cpu", images_per_s=115.0, spread=0.1, data_wait_share=0.05)
    assert TuneResult("d", "cuda", 224, [waiting, fed]).best == fed
    once = Trial(64, 15, 4, "cpu", images_per_s=1001.0, spread=0.0)  # one repeat: no noise known
    assert (
        TuneResult(
            "d", "cuda", 224, [Trial(64, 15, 2, "cpu", 1000.0, "default", spread=0.0), once]
        ).best
        == once
    )


def test_a_refused_default_leaves_the_speedups_without_a_baseline_not_another_trials():
    from rich.console import Console

    trials = [Trial(64, 4, 2, "cpu", 300.0), Trial(64, 2, 2, "cpu", 200.0)]  # no "default"
    r = TuneResult("d", "cuda", 224, trials, notes=["skipped 15 workers: max_host_bytes"])
    assert r.default is None and r.best == trials[0]
    assert json.loads(r.to_json())["default_images_per_s"] is None
    console = Console(record=True, width=120)
    console.print(r)
    assert "×" not in console.export_text()  # no speedup against a trial that was not the default


SEEN_BATCHES: list[int] = []


class _Recording(nn.Module):
    """A tiny model that records the batch sizes it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        SEEN_BATCHES.append(int(x.shape[0]))
        return self.fc(x.mean((2, 3)))


def recording_model() -> nn.Module:
    return _Recording()


def test_a_data_set_smaller_than_a_batch_measures_the_model_at_the_batch_it_gives(tmp_path):
    # the model alone was measured on --batch-size images, a shape the loader never delivers
    images = make_image_folder(tmp_path / "img", 12, 2, short_side=(40, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pack(images, tmp_path / "shards", progress=False, workers=1)
    SEEN_BATCHES.clear()
    r = tune(
        str(tmp_path / "shards"), model=f"{THIS}:recording_model", batch_size=64, device="cpu",
        image_size=16, out=None, seconds=0.3, repeats=1,
    )  # fmt: skip
    assert r.model_images_per_s is not None
    assert max(SEEN_BATCHES) == 12  # the whole data set, never 64


def test_tuning_on_a_folder_names_the_sampled_images_it_left_out(tmp_path: Path):
    images = make_image_folder(tmp_path / "imgs", 16, 2, short_side=(64, 96))
    bad = sorted(images.glob("*/*.jpg"))[-1]
    bad.write_bytes(b"")
    r = tune(
        str(images), batch_size=4, device="cpu", image_size=32, out=None, seconds=0.3, repeats=1
    )
    assert r.trials
    left_out = [n for n in r.notes if "left out" in n]
    assert len(left_out) == 1 and str(bad) in left_out[0] and "empty file" in left_out[0]
    # the rates are those of pre-resized shards: the note says how to pack them
    assert f"`gpufeed pack {images} DST --resize 37`" in " ".join(r.notes)


def fixed_size_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 224 * 224, 10))


def test_a_model_that_cannot_take_the_image_size_is_one_clear_error(shards: Path):
    # it was a traceback from inside the first trial
    with pytest.raises(MeasureError, match=r"the model failed on a 32x32 image: RuntimeError: "):
        tune(
            str(shards), model=f"{THIS}:fixed_size_model", batch_size=4, device="cpu",
            image_size=32, out=None, seconds=0.3, repeats=1,
        )  # fmt: skip
