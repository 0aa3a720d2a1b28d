"""Hugging Face Transformers: ``Trainer(..., callbacks=[GpufeedCallback()])`` profiles the training and
writes the report when it ends; ``LoaderTrainer`` trains, evaluates and predicts on gpufeed Loaders
given where the datasets go.

Each process of a multi-GPU run records its own steps; launch those under ``gpufeed profile -- ...``
(or ``accelerate launch`` under it) so that all ranks share one run directory. Transformers calls no
callback when training raises: such a run stays unfinished, like a killed one, and still loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpufeed.data.loader import Loader
from gpufeed.errors import GpufeedError
from gpufeed.extras import require
from gpufeed.integrations.fit import ProfiledFit

transformers = require("huggingface")
TrainerCallback = transformers.TrainerCallback

from accelerate.data_loader import DataLoaderStateMixin  # noqa: E402  (after the extra's check)
from accelerate.state import GradientState  # noqa: E402


class TrainerOptionError(GpufeedError, ValueError):
    """A Trainer option that a gpufeed Loader cannot follow; the message says what to pass."""


class GpufeedCallback(ProfiledFit, TrainerCallback):
    """Profile `trainer.train()` from start to end; the report goes to `run_dir`/report.html.

    Options: out (folder for run directories), name, interval (system sampling, seconds), report.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._begin()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end(write_report=state.is_world_process_zero)


class DictBatches(DataLoaderStateMixin):
    """A Loader's (images, labels) batches as the dicts a Hugging Face model takes, by default
    ``{"pixel_values": images, "labels": labels}``: what a Trainer's `get_*_dataloader` returns.
    What a Loader's `extras=` adds to its batches is not passed to the model.

    `accelerator.prepare` passes it through unchanged (it only wraps torch DataLoaders): the
    Loader already splits the data by rank and delivers to its device. It marks the epoch's last
    batch in accelerate's GradientState (`end_of_dataloader`), as a prepared DataLoader does.
    """

    _drop_last = True  # for accelerate's `begin()`: no padding for gather_for_metrics to cut off

    def __init__(
        self, loader: Loader, image_key: str = "pixel_values", label_key: str = "labels"
    ) -> None:
        if not isinstance(loader, Loader):
            raise TrainerOptionError(
                f"DictBatches takes a gpufeed Loader, got {type(loader).__name__}: a torch "
                "DataLoader goes to the Trainer as it is"
            )
        self.keys = _batch_keys((image_key, label_key), "(image_key, label_key)")
        self.loader = loader
        self.dataset = loader.dataset  # len(): this rank's samples per epoch (num_examples)
        self.batch_size = loader.batch_size

    def __len__(self) -> int:
        """Batches per epoch: the Trainer counts its steps from it."""
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Choose the Loader's epoch (the Trainer calls it before each training epoch)."""
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The Loader's next epoch (or the one `set_epoch` chose), one dict per batch."""
        image_key, label_key = self.keys
        self.gradient_state = GradientState()
        batches = iter(self.loader)
        left = len(batches)  # an epoch resumed midway has fewer
        self.begin()
        try:
            for batch in batches:  # (images, labels[, the keys and members of `extras=`])
                left -= 1
                self.end_of_dataloader = left == 0
                yield {image_key: batch[0], label_key: batch[1]}
        finally:
            self.end()


def _batch_keys(keys: Any, option: str = "batch_keys") -> tuple[str, str]:
    """`keys` checked to be two different names: (images' key, labels' key)."""
    ok = isinstance(keys, (tuple, list)) and len(keys) == 2
    if not (ok and all(isinstance(k, str) and k for k in keys) and keys[0] != keys[1]):
        raise TrainerOptionError(
            f"{option}={keys!r}: give the model's two input names, images first, e.g. "
            "('pixel_values', 'labels')"
        )
    return keys[0], keys[1]


class LoaderTrainer(transformers.Trainer):
    """A `transformers.Trainer` that takes gpufeed Loaders where datasets go: `train_dataset`,
    `eval_dataset` (or a dict of them) and `predict(loader)`; other datasets work as before.

    Each batch reaches the model as keyword inputs named by `batch_keys` (images, labels). The
    Loader's own batch size, workers and device apply: `per_device_*_batch_size` and the
    `dataloader_*` arguments do not. Each training epoch is the Loader's epoch of that number.
    """

    def __init__(
        self, *args: Any, batch_keys: tuple[str, str] = ("pixel_values", "labels"), **kwargs: Any
    ) -> None:
        self.batch_keys = _batch_keys(batch_keys)
        super().__init__(*args, **kwargs)

    def train(
        self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        """`Trainer.train`, refusing to resume mid-epoch where the Trainer would rebuild the
        Loader as a torch DataLoader to skip batches."""
        if (
            resume_from_checkpoint
            and isinstance(self.train_dataset, Loader)
            and not self.args.ignore_data_skip
        ):
            raise TrainerOptionError(
                "resume_from_checkpoint with a gpufeed Loader: the Trainer skips a resumed "
                "epoch's batches by rebuilding it as a torch DataLoader; pass "
                "TrainingArguments(ignore_data_skip=True) (that epoch restarts from its start)"
            )
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_train_dataloader(self) -> Any:
        """A Loader as train_dataset fed as DictBatches; anything else as the Trainer does."""
        if not isinstance(self.train_dataset, Loader):
            return super().get_train_dataloader()
        if self.args.auto_find_batch_size:
            raise TrainerOptionError(
                "auto_find_batch_size=True: a gpufeed Loader's batch size is fixed when it is "
                "made; pass auto_find_batch_size=False and choose the Loader's batch_size"
            )
        self._train_batch_size = self.train_dataset.batch_size  # the Trainer's sample counts
        return DictBatches(self.train_dataset, *self.batch_keys)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """A Loader to evaluate on (given, named in eval_dataset's dict, or eval_dataset itself)
        fed as DictBatches; anything else as the Trainer does."""
        data = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(eval_dataset, str) and isinstance(self.eval_dataset, dict):
            data = self.eval_dataset[eval_dataset]
        if isinstance(data, Loader):
            return DictBatches(data, *self.batch_keys)
        return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """A Loader given to `predict` fed as DictBatches; anything else as the Trainer does."""
        if isinstance(test_dataset, Loader):
            return DictBatches(test_dataset, *self.batch_keys)
        return super().get_test_dataloader(test_dataset)
