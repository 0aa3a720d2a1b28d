"""A Hugging Face `Trainer` run as users write one, for phase checks: a model taking keyword
inputs and returning its loss, 2 micro-batches accumulated per optimizer step, an evaluation at
the end."""

from __future__ import annotations

import tempfile
import time

import torch
import transformers
from torch import nn

torch.set_num_threads(1)  # two of these share 2 cores in the tests: no OpenMP spinning


class Sleep(nn.Module):
    """Sleeps 5 ms in its forward: time any clock puts in forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005)
        return x


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(Sleep(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randint(0, 8, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


with tempfile.TemporaryDirectory() as out:
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=16, per_device_eval_batch_size=32,
        gradient_accumulation_steps=2, max_steps=16, use_cpu=True, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True,
        remove_unused_columns=False, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=Classifier(), args=args, train_dataset=Pairs(1024), eval_dataset=Pairs(96)
    )
    trainer.train()
    trainer.evaluate()
