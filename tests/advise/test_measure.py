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
