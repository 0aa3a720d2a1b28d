"""The Lightning callback profiles a real `Trainer.fit` on CPU and writes the report at its end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gpufeed

pl = pytest.importorskip("pytorch_lightning")

from gpufeed.integrations.lightning import GpufeedCallback  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callback: GpufeedCallback, module: pl.LightningModule, steps: int) -> None:
    data = TensorDataset(torch.randn(8 * steps, 8), torch.randint(0, 2, (8 * steps,)))
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=8))


def test_a_fit_is_profiled_and_reported(tmp_path: Path) -> None:
    callback = GpufeedCallback(out=tmp_path / "runs", name="lightning-fit", interval=0.1)
    _fit(callback, Tiny(), steps=24)
    assert callback.run_dir is not None and callback.run_dir.parent == tmp_path / "runs"
    run = gpufeed.load(callback.run_dir)
    assert run.meta["finished"] and run.meta["exit_code"] == 0
    assert len(run.steps) == 24 and (run.steps["samples"] == 8).all()
    assert callback.report == callback.run_dir / "report.html"
    assert "lightning-fit" in callback.report.read_text()


def test_a_failing_fit_still_leaves_a_finished_run_marked_failed(tmp_path: Path) -> None:
    class Failing(Tiny):
        def training_step(self, batch, batch_idx):
            if batch_idx == 5:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    callback = GpufeedCallback(out=tmp_path / "runs", interval=0.1)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(callback, Failing(), steps=24)
    run = gpufeed.load(callback.run_dir)
    assert run.meta["finished"] and run.meta["exit_code"] == 1
    assert len(run.steps) == 5
    assert callback.report is not None and callback.report.exists()


def test_a_fit_on_a_gpufeed_loader_trains_epochs_0_1_2_in_order(tmp_path: Path) -> None:
    # Lightning probes iter(loader), then per epoch builds its iterator and only then calls
    # loader.sampler.set_epoch(epoch): each trainer epoch must still get that Loader epoch.
    from gpufeed.data.augment import Augment
    from gpufeed.data.loader import Loader
    from gpufeed.data.packing import pack
    from gpufeed.demo.synth import make_image_folder

    pack(make_image_folder(tmp_path / "img", 24, 2), tmp_path / "pack", workers=1, progress=False)
    options = {"num_workers": 2, "augment": Augment(size=(8, 8)), "device": "cpu", "seed": 7}

    class Seeing(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.seen = nn.Linear(3 * 8 * 8, 2), {}

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.setdefault(self.current_epoch, []).append(y.tolist())
            return nn.functional.cross_entropy(self.net(x.flatten(1).float()), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Seeing()
    with Loader(tmp_path / "pack", 4, **options) as loader:
        pl.Trainer(
            max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        ).fit(module, loader)  # fmt: skip
    for epoch in range(3):
        with Loader(tmp_path / "pack", 4, **options) as want:
            want.set_epoch(epoch)
            assert module.seen[epoch] == [y.tolist() for _, y in want], epoch
