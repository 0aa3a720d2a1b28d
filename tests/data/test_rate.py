"""Measuring a loader: images/s after the warm-up, over as many epochs as the limit needs; a loader
that fails, yields nothing or yields the wrong thing is refused saying so."""

from __future__ import annotations

import gc
import math
import os
import time
from pathlib import Path

import pytest
import torch
from processes import Haunted

from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader
from gpufeed.data.rate import MeasureError, measure_loader


def test_a_real_loader_is_measured_after_its_warm_up_across_epochs(shards: Path):
    loader = Loader(shards, 8, num_workers=1, augment=Augment(size=(16, 16)))
    try:
        per_epoch = len(loader)
        rate = measure_loader(loader, seconds=math.inf, max_batches=per_epoch + 2, warmup=2)
    finally:
        loader.close()
    assert rate.batch_shape[1:] == (3, 16, 16)
    # one epoch holds only per_epoch - 2 batches after the warm-up: the count ran on into the next
    assert 8 * (per_epoch - 2) < rate.images <= 8 * (per_epoch + 2)
    assert rate.images_per_s > 0


class _Costly(torch.utils.data.Dataset):
    """Each item costs `cpu` seconds of CPU (spun, so a busy machine changes its wall time only)
    and then sleeps `sleep` seconds."""

    def __init__(self, cpu: float, sleep: float) -> None:
        self.cpu, self.sleep = cpu, sleep

    def __len__(self) -> int:
        return 10_000  # no epoch ends in the measure: a new epoch's worker start-up costs CPU

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        end = time.process_time() + self.cpu
        while time.process_time() < end:
            pass
        time.sleep(self.sleep)
        return torch.zeros(3, 4, 4), 0


@pytest.mark.parametrize(("cpu", "sleep"), [(0.01, 0.0), (0.0, 0.01)])
def test_the_cpu_an_image_costs_is_measured_in_the_worker_processes(cpu: float, sleep: float):
    loader = torch.utils.data.DataLoader(_Costly(cpu, sleep), batch_size=4, num_workers=2)
    rate = measure_loader(loader, seconds=1.0, warmup=2)
    assert rate.images < 10_000  # one epoch: the workers started before the clock
    if cpu:  # 10 ms each, spent in the workers (batches made before the clock started aside)
        assert rate.cpu_s_per_image > 0.5 * cpu
    else:  # asleep: far below the 5 ms that 2 busy workers would cost at 400 images/s
        assert rate.cpu_s_per_image < 0.5 * 2 / 400


def test_batches_that_are_not_images_and_labels_are_refused():
    with pytest.raises(MeasureError, match="it must yield \\(images, labels\\) pairs"):
        measure_loader([{"x": 1}, {"x": 2}], seconds=1.0)


def test_a_loader_that_yields_nothing_is_refused():
    with pytest.raises(MeasureError, match="yielded no batch"):
        measure_loader([], seconds=1.0)


def test_a_loader_that_raises_is_named_with_its_error():
    def broken():
        yield torch.zeros(2, 3, 4, 4), torch.zeros(2)
        raise OSError("disk gone")

    with pytest.raises(MeasureError, match="the data loader raised OSError: disk gone"):
        measure_loader(broken(), seconds=1.0, warmup=1)


class _Unreadable(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        raise OSError(f"cannot identify image file '/data/img_{i}.jpg'")


def test_an_error_in_a_worker_process_is_one_line_not_its_traceback():
    loader = torch.utils.data.DataLoader(_Unreadable(), batch_size=2, num_workers=1)
    with pytest.raises(MeasureError) as caught:
        measure_loader(loader, seconds=1.0)
    message = str(caught.value)
    assert message == (
        "the data loader raised OSError: cannot identify image file '/data/img_0.jpg' "
        "(in a loader worker process)"
    )


class _Collecting(torch.utils.data.Dataset):
    """Tiny images; a full collection in the worker on every item."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        gc.collect()
        return torch.zeros(3, 4, 4), 0


def test_a_forking_torch_dataloader_never_finalizes_what_the_caller_held(tmp_path: Path):
    diary = tmp_path / "finalized"
    loader = torch.utils.data.DataLoader(_Collecting(), batch_size=2, num_workers=1)
    gc.disable()  # keep the cycle alive until the worker is forked
    try:
        Haunted(diary)
        measure_loader(loader, seconds=math.inf, max_batches=3)
    finally:
        gc.enable()
    gc.collect()
    assert diary.read_text().split() == [str(os.getpid())]
