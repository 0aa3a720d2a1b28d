"""What `diagnose` and `tune` check before they measure anything."""

from __future__ import annotations

import math

import pytest

from gpufeed.advise.diagnose import diagnose
from gpufeed.advise.measure import MeasureError, check_batch_memory
from gpufeed.advise.tune import tune
from gpufeed.data.budget import machine_memory


def _batch(share: float, image_size: int = 512) -> int:
    """The batch size whose uint8 batches take `share` of this machine's memory."""
    return math.ceil(machine_memory() * share / (3 * image_size * image_size))


def test_a_batch_that_could_fit_is_accepted() -> None:
    check_batch_memory(256, 224)
    check_batch_memory(_batch(1 / 7), 512)  # 6 batches' worth is the least a loader holds


def test_a_batch_that_could_never_fit_is_refused_naming_both_options() -> None:
    batch = _batch(1 / 6) + 1
    with pytest.raises(
        MeasureError, match=rf"--batch-size {batch} --image-size 512: one batch"
    ) as e:
        check_batch_memory(batch, 512)
    assert "use a smaller --image-size or --batch-size" in str(e.value)


def test_diagnose_and_tune_refuse_it_before_they_read_the_data(tmp_path) -> None:
    missing = str(tmp_path / "no-such-shards")  # not reached: the sizes are checked first
    for run in (diagnose, tune):
        with pytest.raises(MeasureError, match="--image-size 100000: one batch"):
            run(missing, batch_size=64, device="cpu", image_size=100_000, progress=False)


def test_the_model_alone_is_timed_on_the_batch_shape_the_loader_gives() -> None:
    # a 64×256 batch (segmentation strips) was timed as 256×256: a ceiling 4× too low
    import torch
    from torch import nn

    from gpufeed.advise.measure import measure_model

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc, self.seen = nn.Conv2d(3, 4, 3), nn.Linear(4, 10), set()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.add(tuple(x.shape))
            return self.fc(self.conv(x).mean((2, 3)))

    net = Net()
    rate = measure_model(net, (4, 3, 16, 64), "cpu", seconds=0.2, max_steps=5)
    assert (4, 3, 16, 64) in net.seen and {shape[2:] for shape in net.seen} == {(16, 64)}
    assert rate.batch_shape == (4, 3, 16, 64)
