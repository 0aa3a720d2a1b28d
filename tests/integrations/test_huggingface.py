"""The Hugging Face callback profiles a real `transformers.Trainer` run on CPU and writes the report."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import gpufeed

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from gpufeed.integrations.huggingface import GpufeedCallback  # noqa: E402


class Tiny(nn.Module):
    """A model the Trainer accepts: keyword inputs, a dict with the loss out."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def test_training_is_profiled_and_reported(tmp_path: Path) -> None:
    callback = GpufeedCallback(out=tmp_path / "runs", name="hf-train", interval=0.1)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=8, max_steps=20,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=Tiny(), args=args, train_dataset=Pairs(400), callbacks=[callback]
    )
    trainer.train()
    run = gpufeed.load(callback.run_dir)
    assert run.meta["finished"] and run.meta["exit_code"] == 0
    assert len(run.steps) == 20
    # accelerate reads a batch ahead, and the model takes keyword inputs: step 0 counted both
    # batches it fetched (16) where its forward saw 8
    assert run.steps["samples"].tolist() == [8.0] * 20
    assert callback.report == callback.run_dir / "report.html"
    assert "hf-train" in callback.report.read_text()
