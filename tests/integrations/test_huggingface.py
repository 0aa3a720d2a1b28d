"""The Hugging Face callback profiles a real `transformers.Trainer` run on CPU and writes the report;
`LoaderTrainer` trains, evaluates and predicts on gpufeed Loaders, and refuses what they cannot do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import gpufeed

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from gpufeed.integrations.huggingface import (  # noqa: E402
    DictBatches,
    GpufeedCallback,
    LoaderTrainer,
    TrainerOptionError,
)


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


# --- gpufeed Loaders in the Trainer --------------------------------------------------------------


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 tiny images in two classes, packed."""
    from gpufeed.data.packing import pack
    from gpufeed.demo.synth import make_image_folder

    root = tmp_path_factory.mktemp("hf-data")
    pack(make_image_folder(root / "img", 24, 2), root / "pack", workers=1, progress=False)
    return root / "pack"


def _loader(packed: Path, train: bool = True, **options):
    from gpufeed.data.augment import Augment
    from gpufeed.data.loader import Loader

    options = {"num_workers": 2, "device": "cpu", "shuffle": train, **options}
    return Loader(packed, 4, augment=Augment(size=(8, 8), train=train), **options)


class Images(nn.Module):
    """An image classifier as Transformers models take it: pixel_values and labels by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.fed = nn.Linear(3 * 8 * 8, 2), []

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.fed.append((torch.is_grad_enabled(), labels.tolist()))
        logits = self.net(pixel_values.flatten(1))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def _args(tmp_path: Path, **options) -> transformers.TrainingArguments:
    base = {
        "output_dir": str(tmp_path / "hf"),
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
    }
    base.update(logging_strategy="no", disable_tqdm=True)
    return transformers.TrainingArguments(**{**base, **options})


def test_the_trainer_trains_evaluates_and_predicts_on_loaders(tmp_path: Path, packed: Path) -> None:
    ends = []  # compute_result per batch: True at each pass's last batch only

    def accuracy(p, compute_result: bool) -> dict[str, float]:
        ends.append(compute_result)
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).float().mean())}

    model = Images()
    args = _args(tmp_path, num_train_epochs=2, eval_strategy="epoch", batch_eval_metrics=True)
    with _loader(packed, seed=7) as train, _loader(packed, train=False) as val:
        trainer = LoaderTrainer(
            model=model, args=args, train_dataset=train, eval_dataset={"val": val},
            compute_metrics=accuracy,
        )  # fmt: skip
        assert trainer.train().global_step == 12  # 2 epochs of 6 batches
        metrics = trainer.evaluate()
        assert trainer.evaluate(val)["eval_loss"] == pytest.approx(metrics["eval_val_loss"])
        out = trainer.predict(val)
    trained = [y for grad, y in model.fed if grad]
    evaluated = [y for grad, y in model.fed if not grad]
    for epoch in range(2):  # each training epoch was the Loader's epoch of that number
        with _loader(packed, seed=7) as want:
            want.set_epoch(epoch)
            assert trained[6 * epoch : 6 * epoch + 6] == [y.tolist() for _, y in want]
    with _loader(packed, train=False) as want:
        labels = [y.tolist() for _, y in want]
    # 2 evaluations in training, evaluate() by name and of a Loader, predict(): all of it
    assert evaluated == labels * 5
    assert ends == ([False] * 5 + [True]) * 5
    assert 0 <= metrics["eval_val_accuracy"] <= 1 and metrics["eval_val_loss"] > 0
    assert out.predictions.shape == (24, 2)
    assert out.label_ids.tolist() == [c for batch in labels for c in batch]


def test_dict_batches_feed_a_trainer_of_ones_own(tmp_path: Path, packed: Path) -> None:
    # the documented override for a Trainer subclass of one's own, under other input names
    class Own(transformers.Trainer):
        def get_train_dataloader(self):
            return DictBatches(self.train_dataset, image_key="x", label_key="target")

    class Renamed(Images):
        def forward(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
            return super().forward(x, target)

    model = Renamed()
    with _loader(packed) as train:
        batches = DictBatches(train, image_key="x", label_key="target")
        assert len(batches) == 6 and batches.batch_size == 4 and len(batches.dataset) == 24
        with pytest.raises(TrainerOptionError, match=r"^\(image_key, label_key\)=\('x', 'x'\)"):
            DictBatches(train, image_key="x", label_key="x")
        with pytest.raises(TrainerOptionError, match=r"^DictBatches takes a gpufeed Loader, got"):
            DictBatches(torch.utils.data.DataLoader(Pairs(8)))
        trainer = Own(model=model, args=_args(tmp_path, max_steps=3), train_dataset=train)
        assert trainer.accelerator.prepare(batches) is batches  # wraps torch DataLoaders only
        trainer.train()
    assert len(model.fed) == 3 and all(len(y) == 4 for _, y in model.fed)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"auto_find_batch_size": True}, r"^auto_find_batch_size=True: .*batch_size$"),
        ({"resume": "checkpoint-6"}, r"^resume_from_checkpoint .*ignore_data_skip=True\)"),
        ({"batch_keys": ("pixel_values",)}, r"^batch_keys=\('pixel_values',\): give the model"),
        ({"batch_keys": ("labels", "labels")}, r"^batch_keys=.*give the model's two input names"),
    ],
    ids=["auto_find_batch_size", "resume_from_checkpoint", "one_key", "one_key_twice"],
)
def test_what_a_loader_cannot_do_is_refused_by_name(
    tmp_path: Path, packed: Path, options: dict, match: str
) -> None:
    from gpufeed.errors import GpufeedError

    resume = options.pop("resume", None)
    keys = {"batch_keys": options.pop("batch_keys")} if "batch_keys" in options else {}
    with _loader(packed) as train, pytest.raises(TrainerOptionError, match=match) as e:
        args = _args(tmp_path, max_steps=2, **options)
        LoaderTrainer(model=Images(), args=args, train_dataset=train, **keys).train(resume)
    assert isinstance(e.value, GpufeedError) and "\n" not in str(e.value)


def test_a_loader_with_extras_feeds_the_model_its_images_and_labels(packed: Path) -> None:
    with _loader(packed, extras=("__key__",)) as loader:
        batch = next(iter(DictBatches(loader)))
    assert set(batch) == {"pixel_values", "labels"} and len(batch["labels"]) == 4
