"""`gpufeed diagnose`: a deliberately slow loader is input-bound, a heavy model compute-bound, the
alternatives are measured, and bad input gets a clear error naming the option."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from typer.testing import CliRunner

from gpufeed.advise.diagnose import diagnose
from gpufeed.advise.measure import MeasureError
from gpufeed.cli import app
from gpufeed.demo.synth import make_image_folder

THIS = __file__  # the user objects below are named as THIS:function, like a user's train.py


class _Images(Dataset):
    def __init__(self, n: int, size: int, sleep: float) -> None:
        self.x = torch.randn(n, 3, size, size)
        self.sleep = sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.sleep:
            time.sleep(self.sleep)
        return self.x[i], i % 4


def slow_loader() -> DataLoader:
    """Every item takes 25 ms (slow storage): at most 40 images/s with one process."""
    return DataLoader(_Images(400, 32, 0.025), batch_size=16, num_workers=0)


def slow_batch_sampler_loader() -> DataLoader:
    """The same, batched by a batch_sampler (as bucketing or distributed samplers do)."""
    from torch.utils.data import BatchSampler, SequentialSampler

    images = _Images(400, 32, 0.025)
    return DataLoader(images, batch_sampler=BatchSampler(SequentialSampler(images), 16, False))


class _MainProcessOnly(_Images):
    """Items that load only in the training process (say, from a handle a worker cannot open)."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("this dataset cannot load in a worker process")
        return super().__getitem__(i)


def slow_main_process_loader() -> DataLoader:
    return DataLoader(_MainProcessOnly(400, 32, 0.025), batch_size=16, num_workers=0)


def fast_loader() -> DataLoader:
    """Tensors already in memory: thousands of images/s."""
    return DataLoader(_Images(512, 32, 0.0), batch_size=16, num_workers=0)


def tiny_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.Flatten(), nn.LazyLinear(4))


THREADS_SEEN: list[int] = []  # torch threads each training step of thread_counting_cnn ran with


class _ThreadCounting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_cnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            THREADS_SEEN.append(torch.get_num_threads())
        return self.net(x)


def thread_counting_cnn() -> nn.Module:
    THREADS_SEEN.clear()
    return _ThreadCounting()


class _Paced(nn.Module):
    """A model whose training step takes 1 ms of wall time per image and next to no CPU, as one
    on a GPU would: about 1,000 images/s, whatever the threads."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(0.001 * x.shape[0])
        return self.fc(x.float().mean((2, 3)))


def paced_model() -> nn.Module:
    return _Paced()


def not_a_model() -> str:
    return "oops"


class _Broken:
    """A loader whose dataset hits a bad file on the second batch."""

    def __iter__(self):
        yield torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
        raise OSError("cannot read /data/img_17.jpg")


def broken_loader() -> _Broken:
    return _Broken()


def wrong_input_model() -> nn.Module:
    return nn.Conv2d(1, 4, 3)  # expects one channel; the loader gives three


@pytest.mark.parametrize("loader", ["slow_loader", "slow_batch_sampler_loader"])
def test_a_slow_loader_is_input_bound_and_more_workers_are_measured(loader: str):
    d = diagnose(f"{THIS}:{loader}", model=f"{THIS}:tiny_cnn", device="cpu", seconds=1.5)
    assert d.verdict == "input-bound"
    assert d.loader.images_per_s < 41  # bounded by the 25 ms sleep per item
    assert d.model_rate.images_per_s > 2 * d.loader.images_per_s
    assert d.ratio == pytest.approx(d.model_rate.images_per_s / d.loader.images_per_s)
    # the verdict comes from training on the loader's batches: no faster than the loader alone
    assert d.together.images_per_s < 1.3 * d.loader.images_per_s
    assert d.together.data_wait_share > 0.5
    assert d.gpu_idle_share == pytest.approx(
        1 - d.together.images_per_s / d.model_rate.images_per_s
    )
    assert d.gpu_idle_share > 0.5 and d.ceiling_share == pytest.approx(1 - d.gpu_idle_share)
    (alt,) = d.alternatives
    assert "workers" in alt.name
    assert alt.images_per_s > 1.3 * d.loader.images_per_s  # two sleeping workers overlap
    # the loader sleeps: the offload advice costs an image the CPU measured, far below the 25 ms
    # a busy core would have spent per image at this rate (which advised ~65 remote cores)
    assert d.offload.cpu_s_per_image == d.loader.cpu_s_per_image < 0.2 / d.loader.images_per_s


def test_an_alternative_that_fails_is_skipped_with_its_reason_and_the_diagnosis_stands(
    capfd: pytest.CaptureFixture[str],
):
    d = diagnose(
        f"{THIS}:slow_main_process_loader", model=f"{THIS}:tiny_cnn", device="cpu", seconds=1.0
    )
    assert d.verdict == "input-bound" and d.alternatives == []
    err = capfd.readouterr().err
    assert "skipped your loader with num_workers=" in err
    assert "this dataset cannot load in a worker process" in err


def test_from_python_it_returns_the_diagnosis_and_prints_nothing_on_stdout(
    capfd: pytest.CaptureFixture[str],
):
    d = diagnose(f"{THIS}:fast_loader", model=f"{THIS}:tiny_cnn", device="cpu", seconds=0.5)
    out, err = capfd.readouterr()
    assert out == ""  # the command line prints what it returns (tests/test_cli.py)
    assert "measuring the loader alone" in err  # progress, on stderr
    assert d.verdict in ("input-bound", "compute-bound") and d.offload is not None
    diagnose(
        f"{THIS}:fast_loader", model=f"{THIS}:tiny_cnn", device="cpu", seconds=0.5, progress=False
    )
    out, err = capfd.readouterr()
    assert out == "" and "measuring" not in err


def test_on_a_cpu_an_alternative_is_judged_against_the_model_with_the_threads_its_workers_leave():
    from rich.console import Console

    from gpufeed.cores import usable_cores

    d = diagnose(
        f"{THIS}:slow_loader", model=f"{THIS}:thread_counting_cnn", device="cpu", seconds=1
    )
    assert d.threads == usable_cores()  # the job's loader has no worker: the model gets every core
    (alt,) = d.alternatives  # on a CPU, every core a worker: the model keeps one thread
    assert 1 in THREADS_SEEN and alt.workers == usable_cores()
    # its verdict compares with the model timed with the thread its workers leave, not the job's
    assert alt.threads == 1 and alt.ceiling == d.ceiling_beside(alt) and alt.ceiling > 0
    faster = alt.images_per_s >= alt.ceiling
    assert d.verdict_with(alt) == ("compute-bound" if faster else "input-bound")
    console = Console(record=True, width=200)
    console.print(d)
    out = console.export_text()
    assert "model beside its workers" in out and f"{alt.ceiling:,.1f} (1 thread)" in out


def test_a_heavy_model_is_compute_bound_with_no_idle_time():
    d = diagnose(f"{THIS}:fast_loader", model="resnet18", device="cpu", seconds=1.5)
    assert d.verdict == "compute-bound"
    assert d.loader.batch_shape == (16, 3, 32, 32)
    assert d.loader.images_per_s > d.model_rate.images_per_s
    assert d.together.data_wait_share < 0.1  # trained on the loader, it hardly ever waits
    assert d.settings.amp is None and not d.settings.channels_last  # CPU defaults
    assert d.alternatives == []


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("photos"), 64, 4, short_side=(300, 400))


def test_an_image_folder_is_measured_with_pre_resized_shards_as_an_alternative(photos: Path):
    d = diagnose(
        str(photos), model=f"{THIS}:tiny_cnn", batch_size=32, device="cpu", workers=1,
        image_size=32, seconds=1.5,
    )  # fmt: skip
    assert "Pillow" in d.loader_desc and d.loader.batch_shape == (32, 3, 32, 32)
    assert d.augment_load == 1  # by default, the recipe with one rotation per image
    assert d.verdict == "input-bound"
    shards = [a for a in d.alternatives if "pre-resized shards" in a.name]
    assert len(shards) == 1
    assert shards[0].images_per_s > d.loader.images_per_s  # far less decode work per image


def test_the_offload_is_sized_from_the_gpufeed_loader_that_ray_cpu_nodes_would_run(photos: Path):
    # Pillow decoding of full-size photos cannot feed a model of ~1,000 images/s; the pre-resized
    # shards alternative can, so offloading is not needed. It used to be sized from the Pillow
    # pipeline's CPU per image, which Loader(cluster=...) never runs, and said it would help.
    d = diagnose(
        str(photos), model=f"{THIS}:paced_model", batch_size=32, device="cpu", workers=1,
        image_size=32, seconds=1.5,
    )  # fmt: skip
    assert d.verdict == "input-bound"
    (alt,) = [a for a in d.alternatives if "pre-resized shards, gpufeed Loader" in a.name]
    assert alt.images_per_s > d.model_rate.images_per_s  # the paced model keeps its pace
    assert not d.offload.helps and d.offload.remote_cores == 0
    assert d.verdict_with(alt) == "compute-bound"
    assert d.offload.cpu_s_per_image <= alt.cpu_s_per_image
    assert d.offload_from == alt.name == d.to_dict()["offload"]["sized_from"]
    assert d.offload_text().startswith("offload to CPU nodes: not needed")
    assert d.offload_text().endswith(f"; CPU/image measured on {alt.name}")


def test_without_a_gpufeed_loader_alternative_the_offload_names_the_loader_it_was_sized_from():
    d = diagnose(f"{THIS}:slow_loader", model=f"{THIS}:tiny_cnn", device="cpu", seconds=0.5)
    assert not any(a.cluster_pipeline for a in d.alternatives)
    assert d.offload_from == d.loader_desc and d.offload.cpu_s_per_image == d.loader.cpu_s_per_image
    assert d.offload_text().endswith(f"; CPU/image measured on {d.loader_desc}")


def test_shards_are_measured_with_the_gpufeed_loader(
    photos: Path, tmp_path: Path, loader_recipes: list
):
    import warnings

    from gpufeed.cores import usable_cores
    from gpufeed.data.augment import Augment
    from gpufeed.data.packing import pack

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny shards, below the 1-128 MB advice
        pack(photos, tmp_path / "shards", resize=40, progress=False, workers=1)
    d = diagnose(
        str(tmp_path / "shards"), model=f"{THIS}:tiny_cnn", batch_size=16, device="cpu",
        workers=1, image_size=32, seconds=1.5, augment_load=0,
    )  # fmt: skip
    assert d.loader_desc.startswith("gpufeed Loader") and d.loader.batch_shape[1:] == (3, 32, 32)
    # --augment-load 0: the ImageNet recipe for the job's loader and every alternative alike
    assert loader_recipes and all(r == Augment(size=(32, 32)) for r in loader_recipes)
    assert d.augment_load == 0 and d.to_dict()["augment_load"] == 0
    assert d.threads == max(1, usable_cores() - 1)  # the model trains beside one loader worker
    assert d.verdict == "input-bound"  # a three-layer CNN outruns JPEG decoding
    if usable_cores() > 1:
        assert [a.name for a in d.alternatives] == [
            f"gpufeed Loader (CPU preprocessing, num_workers={usable_cores()})"
        ]
        assert d.alternatives[0].images_per_s > 0
    # every Loader it made is closed when it returns: no feeder thread outlives it (one still
    # running torch code at interpreter exit aborted the process, exit code 134)
    assert [t.name for t in threading.enumerate() if t.name.startswith("gpufeed-")] == []


def test_gpu_preprocessing_that_makes_training_wait_is_judged_by_training_on_it():
    """A GPU decoder takes GPU time from the model: fast alone (3× what the model takes), it still
    leaves training waiting (nvJPEG beside RN-50 on an H200). Its verdict comes from training on
    it, shown beside its rate; an alternative not trained on keeps the verdict of its rate."""
    import json

    from rich.console import Console

    from gpufeed.advise.diagnose import Alternative, Diagnosis
    from gpufeed.advise.measure import Rate

    shape = (256, 3, 224, 224)
    gpu = Alternative("gpufeed Loader (GPU preprocessing, num_workers=15)", 13_000.0, 15)
    gpu.trained = Rate(3_600, 1.0, shape, 0.38)
    split = Alternative("gpufeed Loader (CPU decode, GPU warps ...)", 4_500.0, 15)
    split.trained = Rate(4_400, 1.0, shape, 0.02)
    cpu = Alternative("gpufeed Loader (CPU preprocessing, num_workers=15)", 1_100.0, 15)
    d = Diagnosis(
        "shards/", "gpufeed Loader, 8 workers", "resnet50", "cuda",
        Rate(1_000, 1.0, shape), Rate(4_700, 1.0, shape),
        alternatives=[gpu, split, cpu], together=Rate(1_000, 1.0, shape, 0.78),
    )  # fmt: skip
    assert [d.verdict_with(a) for a in (gpu, split, cpu)] == [
        "input-bound",  # by its rate alone it would read compute-bound
        "compute-bound",
        "input-bound",
    ]
    console = Console(record=True, width=250)
    console.print(d)
    out = console.export_text()
    assert "trained on it" in out
    assert "3,600.0 (77% of the model alone)" in out and "4,400.0 (94% of the model alone)" in out
    (row,) = [line for line in out.splitlines() if "CPU preprocessing, num_workers=15" in line]
    assert "—" in row  # not trained on: a CPU path leaves the GPU to the model
    alts = json.loads(json.dumps(d.to_dict()))["alternatives"]
    assert [a["trained_images_per_s"] for a in alts] == [3_600, 4_400, None]
    assert [a["trained_data_wait_share"] for a in alts] == [0.38, 0.02, None]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_gpu_alternatives_are_trained_on(photos: Path, tmp_path: Path):
    import warnings

    from gpufeed.data.packing import pack

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny shards, below the 1-128 MB advice
        pack(photos, tmp_path / "shards", progress=False, workers=1)
    d = diagnose(
        str(tmp_path / "shards"), model=f"{THIS}:tiny_cnn", batch_size=16, device="cuda",
        workers=1, image_size=32, seconds=1.5, augment_load=3,
    )  # fmt: skip
    assert d.verdict == "input-bound"  # a three-layer CNN outruns one worker's JPEG decoding
    gpu = [a for a in d.alternatives if "GPU" in a.name]
    assert len(gpu) == 2 and any("decoder='workers'" in a.name for a in gpu)  # load 3: the split
    assert all(a.trained is not None and a.trained.images_per_s > 0 for a in gpu)
    assert all(a.trained is None for a in d.alternatives if a not in gpu)


runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "/no/such/dir"], "--data /no/such/dir: no such directory"),
        (["--data", f"{THIS}:missing"], "has no function 'missing'"),
        (["--data", "no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
        (["--data", f"{THIS}:fast_loader", "--model", "resnet9"], "--model 'resnet9' is not known"),
        (["--data", f"{THIS}:fast_loader", "--model", f"{THIS}:not_a_model"], "not an nn.Module"),
        (["--data", f"{THIS}:fast_loader", "--device", "tpu"], "--device 'tpu'"),
        (["--data", f"{THIS}:fast_loader", "--precision", "int3"], "--precision 'int3'"),
        (["--data", f"{THIS}:fast_loader", "--augment-load", "-1"], "--augment-load -1: must be 0"),
        (
            ["--data", f"{THIS}:fast_loader", "--augment-load", "65"],
            "--augment-load 65: must be 64",
        ),
        (
            ["--data", f"{THIS}:broken_loader"],
            "the data loader raised OSError: cannot read /data/img_17.jpg",
        ),
        (
            ["--data", f"{THIS}:fast_loader", "--model", f"{THIS}:wrong_input_model"],
            "the model failed to train on a batch of shape (16, 3, 32, 32)",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_option(args: list[str], message: str):
    res = runner.invoke(app, ["diagnose", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output.replace("\n", "")


def test_a_function_that_returns_no_loader_is_refused():
    with pytest.raises(MeasureError, match="cannot be iterated"):
        diagnose(f"{THIS}:time_is_not_a_loader", model=f"{THIS}:tiny_cnn", device="cpu")


def time_is_not_a_loader() -> float:
    return 3.0


def test_a_diagnosis_prints_itself_with_rich():
    """What `gpufeed diagnose` prints at the end is the returned Diagnosis, rendered by itself."""
    from rich.console import Console

    from gpufeed.advise.diagnose import Alternative, Diagnosis
    from gpufeed.advise.measure import Rate
    from gpufeed.advise.offload import offload_advice

    shape = (64, 3, 224, 224)
    d = Diagnosis(
        "data-dir",
        "gpufeed Loader, 1 worker",
        "resnet18",
        "cpu",
        Rate(1000, 2.0, shape),
        Rate(2000, 2.0, shape),
        alternatives=[Alternative("pre-resized shards", 3000.0)],
        together=Rate(900, 2.0, shape, 0.3),
        offload=offload_advice(500, 1, 1000, host_cores=7),
    )
    console = Console(record=True, width=200)
    console.print(d)
    out = console.export_text()
    assert "gpufeed diagnose: data-dir" in out and "INPUT-BOUND" in out
    assert "pre-resized shards" in out and "×6.00" in out  # loader alone: 500 images/s
    assert "offload to CPU nodes:" in out
