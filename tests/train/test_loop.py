"""`fit` trains for real: weights move, AMP and channels_last work, throughput is measured."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from gpufeed.train.loop import FitResult, SyntheticData, fit
from gpufeed.train.resnet import resnet


def batches(n: int, batch: int = 4, size: int = 64, classes: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, 3, size, size, generator=g),
            torch.randint(0, classes, (batch,), generator=g),
        )
        for _ in range(n)
    ]


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def tiny_model(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, classes)
    )


@pytest.mark.parametrize("amp", [None, "bf16"])
def test_one_resnet18_step_updates_every_trainable_layer(amp: str | None) -> None:
    torch.manual_seed(0)
    model = resnet("resnet18", num_classes=10)
    before = snapshot(model)
    result = fit(model, batches(1), steps=1, amp=amp, device="cpu", verbose=False)
    assert isinstance(result, FitResult)
    assert (result.steps, result.epochs, result.samples) == (1, 1, 4)
    assert torch.isfinite(torch.tensor(result.final_loss))
    after = snapshot(model)
    assert not torch.equal(before["conv1.weight"], after["conv1.weight"])
    assert not torch.equal(before["fc.weight"], after["fc.weight"])
    assert all(
        v.dtype == torch.float32 for v in after.values()
    )  # autocast keeps fp32 master weights


def test_channels_last_trains_the_model_in_channels_last_layout() -> None:
    model = resnet("resnet18", num_classes=10)
    fit(model, batches(1), steps=1, channels_last=True, amp="bf16", device="cpu", verbose=False)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_adam_and_a_repeated_batch_drive_the_loss_down() -> None:
    torch.manual_seed(0)
    data = batches(1, batch=8, size=16, classes=3) * 30
    first = fit(tiny_model(3), data[:1], optimizer="adam", lr=0.05, device="cpu", verbose=False)
    torch.manual_seed(0)
    trained = fit(tiny_model(3), data, optimizer="adam", lr=0.05, device="cpu", verbose=False)
    assert trained.final_loss < first.final_loss


def test_synthetic_mode_feeds_one_resident_batch_for_the_requested_steps() -> None:
    result = fit(
        tiny_model(5),
        SyntheticData(8, image_size=16, num_classes=5, steps=6),
        warmup=2,
        verbose=False,
    )
    assert (result.steps, result.samples, result.measured_steps) == (6, 48, 4)
    assert result.images_per_s > 0
    assert len(result.step_times) == len(result.data_waits) == 6


def test_steps_caps_training_across_epochs_and_set_epoch_is_called() -> None:
    class EpochLoader:
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def __iter__(self):
            return iter(batches(3, size=16))

    loader = EpochLoader()
    result = fit(tiny_model(), loader, epochs=5, steps=7, device="cpu", verbose=False)
    assert (result.steps, result.epochs) == (7, 3)
    assert loader.epochs == [0, 1, 2]


def test_a_gpufeed_loader_goes_on_from_its_own_position(tmp_path) -> None:
    # fit() set epochs 0, 1, ... on every loader: a restored Loader started over at epoch 0, and
    # fit(epochs=1) called once per epoch trained the same order every time
    from gpufeed.data.augment import Augment
    from gpufeed.data.loader import Loader
    from gpufeed.data.packing import pack
    from gpufeed.demo.synth import make_image_folder

    pack(make_image_folder(tmp_path / "img", 24, 2), tmp_path / "pack", workers=1, progress=False)
    options = {"num_workers": 0, "augment": Augment(size=(16, 16)), "device": "cpu"}
    with Loader(tmp_path / "pack", 4, **options) as loader:
        state = {**loader.state_dict(), "epoch": 2, "batch": 3}
        loader.load_state_dict(state)
        fit(tiny_model(), loader, steps=1, device="cpu", verbose=False)
        assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (2, 4)
        fit(tiny_model(), loader, steps=1, device="cpu", verbose=False)  # in chunks: no gap
        assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (2, 5)
    with Loader(tmp_path / "pack", 4, **options) as loader:
        for epoch in range(2):
            fit(tiny_model(), loader, epochs=1, device="cpu", verbose=False)
            assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (epoch + 1, 0)


def test_data_wait_is_time_blocked_on_the_loader() -> None:
    def slow():
        for b in batches(4, size=16):
            time.sleep(0.05)
            yield b

    result = fit(tiny_model(), slow(), device="cpu", warmup=0, verbose=False)
    assert result.steps == 4
    assert all(w >= 0.05 for w in result.data_waits)  # each batch slept 50 ms before it came
    assert all(w < t for w, t in zip(result.data_waits, result.step_times, strict=True))
    assert result.data_wait_fraction == pytest.approx(
        sum(result.data_waits) / sum(result.step_times)
    )


def test_max_seconds_stops_an_endless_loader() -> None:
    def endless():
        while True:
            time.sleep(0.01)
            yield batches(1, size=16)[0]

    result = fit(tiny_model(), endless(), max_seconds=0.3, device="cpu", verbose=False)
    assert 1 <= result.steps < 300


def test_max_seconds_counts_from_the_end_of_the_warm_up() -> None:
    # torch.compile compiles in the first step, for minutes with RN-50: a time limit counted
    # from the start stopped after that one step and timed the compilation as throughput
    class CompilesFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.calls = tiny_model(), 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls == 1:
                time.sleep(0.6)
            return self.net(x)

    def endless():
        while True:
            yield batches(1, size=16)[0]

    result = fit(CompilesFirst(), endless(), warmup=2, max_seconds=0.3, device="cpu", verbose=False)
    assert result.steps > 2 and result.measured_steps == result.steps - 2
    assert result.seconds >= 0.9  # the warm-up, then 0.3 s of measured steps


def test_dict_batches_are_accepted() -> None:
    data = [{"images": x, "labels": y} for x, y in batches(2, size=16)]
    assert fit(tiny_model(), data, device="cpu", verbose=False).steps == 2


def test_logging_prints_throughput_lines(capsys: pytest.CaptureFixture[str]) -> None:
    fit(tiny_model(), batches(4, size=16), device="cpu", log_every=2)
    err = capsys.readouterr().err
    assert "step 2" in err and "step 4" in err and "img/s" in err and "done 4 steps" in err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amp": "fp8"}, "unknown amp mode 'fp8'"),
        ({"optimizer": "lbfgs"}, "unknown optimizer 'lbfgs'"),
        ({"steps": 0}, "steps must be at least 1"),
        ({"epochs": 0}, "epochs must be at least 1"),
    ],
)
def test_bad_options_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit(tiny_model(), batches(1, size=16), device="cpu", verbose=False, **kwargs)


def test_a_loader_that_yields_bare_tensors_gets_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"yielded a Tensor.*\(images, labels\)"):
        fit(tiny_model(), [torch.randn(2, 3, 16, 16)], device="cpu", verbose=False)


def test_synthetic_data_rejects_empty_shapes() -> None:
    with pytest.raises(ValueError, match=r"SyntheticData\.batch_size"):
        SyntheticData(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp16_with_grad_scaler_and_channels_last_on_the_gpu() -> None:
    model = resnet("resnet18", num_classes=10)
    result = fit(
        model, SyntheticData(16, 64, 10, steps=5), amp="fp16", channels_last=True, verbose=False
    )
    assert result.steps == 5 and torch.isfinite(torch.tensor(result.final_loss))
    assert next(model.parameters()).is_cuda


def test_an_empty_loader_is_an_error_not_a_rate_of_zero() -> None:
    with pytest.raises(ValueError, match="the loader yielded no batch"):
        fit(tiny_model(), [], device="cpu", verbose=False)


def test_channels_last_leaves_inputs_that_are_not_images_as_they_are() -> None:
    # a 2-D (tabular) or 3-D input raised "required rank 4 tensor to use channels_last format"
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    data = [(torch.randn(4, 3, 4), torch.randint(0, 3, (4,))) for _ in range(3)]
    assert fit(model, data, device="cpu", channels_last=True, verbose=False).steps == 3
