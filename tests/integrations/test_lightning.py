"""The Lightning callback profiles a real `Trainer.fit` on CPU and writes the report at its end; a
gpufeed Loader serves every stage (train, val, test, predict), given to the Trainer or returned by
hooks, and a Loader made for another rank than Lightning's processes is refused."""

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


# --- a gpufeed Loader as every Lightning loader -------------------------------------------------

LOADER_OPTIONS = {"num_workers": 2, "device": "cpu"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 tiny images in two classes, packed."""
    from gpufeed.data.packing import pack
    from gpufeed.demo.synth import make_image_folder

    root = tmp_path_factory.mktemp("lightning-data")
    pack(make_image_folder(root / "img", 24, 2), root / "pack", workers=1, progress=False)
    return root / "pack"


def _loader(packed: Path, stage: str = "train", **options):
    """A training Loader (random crops, shuffled), or for other stages a deterministic one."""
    from gpufeed.data.augment import Augment
    from gpufeed.data.loader import Loader

    augment = Augment(size=(8, 8), train=stage == "train")
    return Loader(packed, 4, augment=augment, **{**LOADER_OPTIONS, **options})


def _samples(x: torch.Tensor, y: torch.Tensor) -> list[tuple[int, float]]:
    """Each sample as (label, pixel sum): which sample it is, under a deterministic Augment."""
    return [(int(c), round(float(s), 3)) for c, s in zip(y, x.double().sum((1, 2, 3)), strict=True)]


def _in_order(packed: Path) -> list[tuple[int, float]]:
    """The data set's samples in their packed order."""
    with _loader(packed, "val", shuffle=False) as loader:
        return [s for x, y in loader for s in _samples(x, y)]


class Recording(pl.LightningModule):
    """Records what each pass of each stage was fed: (stage, sanity check?, samples in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.fed = nn.Linear(3 * 8 * 8, 2), []

    def _begin(self, stage: str) -> None:
        self.fed.append((stage, self.trainer.sanity_checking, []))

    def on_train_epoch_start(self) -> None:
        self._begin("train")

    def on_validation_epoch_start(self) -> None:
        self._begin("val")

    def on_test_epoch_start(self) -> None:
        self._begin("test")

    def on_predict_epoch_start(self) -> None:
        self._begin("predict")

    def _record(self, stage: str, batch) -> torch.Tensor:
        if not self.fed:  # a fit resumed mid-epoch starts no epoch
            self._begin(stage)
        x, y = batch
        self.fed[-1][2].extend(_samples(x, y))
        return nn.functional.cross_entropy(self.net(x.flatten(1)), y)

    def training_step(self, batch, batch_idx):
        return self._record("train", batch)

    def validation_step(self, batch, batch_idx):
        self._record("val", batch)

    def test_step(self, batch, batch_idx):
        self._record("test", batch)

    def predict_step(self, batch, batch_idx):
        self._record("predict", batch)
        return batch[1]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def passes(self, stage: str, sanity: bool = False) -> list[list[tuple[int, float]]]:
        """The samples fed to each pass of `stage`, in order."""
        return [samples for s, checking, samples in self.fed if s == stage and checking == sanity]


def _trainer(**options) -> pl.Trainer:
    base = {"max_epochs": 2, "accelerator": "cpu", "devices": 1, "logger": False}
    base.update(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return pl.Trainer(**{**base, **options})


def test_a_loader_given_to_fit_validate_test_and_predict_serves_each_whole(packed: Path) -> None:
    in_order = _in_order(packed)
    whole = sorted(in_order)
    module = Recording()
    with (
        _loader(packed) as train,
        _loader(packed, "val") as val,  # shuffled: each pass in another order, all of it
        _loader(packed, "test", shuffle=False) as test,
    ):
        trainer = _trainer()
        trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
        assert trainer.validate(module, dataloaders=val, verbose=False)
        assert trainer.test(module, dataloaders=test, verbose=False)
        predictions = trainer.predict(module, dataloaders=test)
    # the sanity check took 2 batches of the val set; every later pass took all of it again
    assert [len(p) for p in module.passes("val", sanity=True)] == [2 * 4]
    val_passes = module.passes("val")
    assert len(val_passes) == 3  # epochs 0 and 1 of fit, then validate()
    assert all(sorted(p) == whole for p in val_passes)
    assert [len(p) for p in module.passes("train")] == [24, 24]
    assert module.passes("test") == [in_order] and module.passes("predict") == [in_order]
    assert torch.cat(predictions).tolist() == [c for c, _ in in_order]


class Hooked(Recording):
    """Makes its Loaders in the `*_dataloader()` hooks (the packed data set set as `packed`)."""

    packed: Path

    def train_dataloader(self):
        return _loader(self.packed)

    def val_dataloader(self):
        return _loader(self.packed, "val")

    def test_dataloader(self):
        return _loader(self.packed, "test", shuffle=False)

    def predict_dataloader(self):
        return _loader(self.packed, "predict", shuffle=False)


class Data(pl.LightningDataModule):
    """The same hooks on a LightningDataModule."""

    def __init__(self, packed: Path) -> None:
        super().__init__()
        self.packed = packed

    train_dataloader = Hooked.train_dataloader
    val_dataloader = Hooked.val_dataloader
    test_dataloader = Hooked.test_dataloader
    predict_dataloader = Hooked.predict_dataloader


@pytest.mark.parametrize("where", ["module", "datamodule"])
def test_loaders_returned_by_hooks_serve_every_stage(packed: Path, where: str) -> None:
    whole = sorted(_in_order(packed))
    if where == "module":
        module, kwargs = Hooked(), {}
        module.packed = packed
    else:
        module, kwargs = Recording(), {"datamodule": Data(packed)}
    # a new val Loader every epoch: the previous one is dropped with its workers
    trainer = _trainer(reload_dataloaders_every_n_epochs=1)
    trainer.fit(module, **kwargs)
    trainer.validate(module, verbose=False, **kwargs)
    trainer.test(module, verbose=False, **kwargs)
    trainer.predict(module, **kwargs)
    assert [len(p) for p in module.passes("train")] == [24, 24]
    assert len(module.passes("val")) == 3
    for stage in ("val", "test", "predict"):
        assert all(sorted(p) == whole for p in module.passes(stage)), stage


@pytest.mark.parametrize("use_distributed_sampler", [True, False])
def test_passes_cut_short_leave_the_next_whole(packed: Path, use_distributed_sampler: bool) -> None:
    # Lightning re-creates no Loader (it only swaps samplers of torch DataLoaders): with or
    # without use_distributed_sampler the same Loader serves; passes it stops early (the sanity
    # check, limit_val_batches) leave the next one whole.
    module = Recording()
    first = _in_order(packed)[:8]  # 2 batches
    with _loader(packed) as train, _loader(packed, "val", shuffle=False) as val:
        trainer = _trainer(
            limit_val_batches=2,
            num_sanity_val_steps=1,
            use_distributed_sampler=use_distributed_sampler,
        )
        trainer.fit(module, train, val)
        assert trainer.val_dataloaders is val and trainer.train_dataloader is train
        assert module.passes("val", sanity=True) == [first[:4]]
        assert module.passes("val") == [first, first]
        _trainer().validate(module, val, verbose=False)
    assert module.passes("val")[2] == _in_order(packed)


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_a_fit_resumed_mid_epoch_gets_exactly_the_rest(packed: Path, tmp_path: Path) -> None:
    # Lightning saves the train Loader's state_dict() in its checkpoints and loads it on resume
    save = pl.callbacks.ModelCheckpoint(tmp_path, every_n_train_steps=4, save_top_k=-1)
    first, resumed = Recording(), Recording()
    with _loader(packed, seed=3) as train:
        _trainer(enable_checkpointing=True, callbacks=[save], limit_val_batches=0).fit(first, train)
    with _loader(packed, seed=3) as train:
        checkpoint = tmp_path / "epoch=0-step=4.ckpt"
        _trainer(limit_val_batches=0).fit(resumed, train, ckpt_path=checkpoint)
    done = first.passes("train")
    assert resumed.passes("train") == [done[0][4 * 4 :], done[1]]  # after batch 4 of epoch 0


PROFILED_FIT = """
import sys
import torch
from torch import nn
import pytorch_lightning as pl
from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3 * 8 * 8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x.flatten(1)), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x.flatten(1)), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

options = {"num_workers": 2, "device": "cpu"}
train = Loader(sys.argv[1], 4, augment=Augment(size=(8, 8)), **options)
val = Loader(sys.argv[1], 4, augment=Augment(size=(8, 8), train=False), **options)
pl.Trainer(
    max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False,
).fit(Tiny(), train, val)
"""


def test_validation_on_a_loader_is_profiled_as_evaluation(packed: Path, run_profiled) -> None:
    cp, run_dir = run_profiled(PROFILED_FIT, str(packed))
    assert cp.returncode == 0 and run_dir is not None, cp.stderr[-3000:]
    run = gpufeed.load(run_dir)
    assert len(run.steps) == 2 * 6  # 2 epochs of 24 samples in batches of 4
    assert (run.steps["samples"] == 4).all()
    # the sanity check (2 batches), then one whole pass per epoch; none is a training step
    assert run.evals[["batches", "samples"]].values.tolist() == [[2, 8], [6, 24], [6, 24]]


def test_a_loader_made_for_another_rank_is_refused_when_iterated(packed: Path, monkeypatch) -> None:
    # Lightning's Trainer(devices=N) starts its processes after a Loader made at the top of the
    # script: it detected rank and world size from the environment then (here: rank 1 of 2)
    import torch.distributed as dist

    from gpufeed.data.rank_check import RankMismatch
    from gpufeed.errors import GpufeedError

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = _loader(packed)
    given = _loader(packed, rank=1, world_size=2)  # said so: a data-parallel group of its own
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RankMismatch, match=r"rank 1 of 2 but iterated on rank 0 of 1") as e:
            iter(loader)
        assert isinstance(e.value, GpufeedError) and "\n" not in str(e.value)
        assert len(list(given)) == 3
    finally:
        dist.destroy_process_group()
        loader.close()
        given.close()


DDP_FIT = """
import json, sys
from pathlib import Path
import torch
from torch import nn
import pytorch_lightning as pl
from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader

packed, out = Path(sys.argv[1]), Path(sys.argv[2])
options = {"num_workers": 1, "device": "cpu", "augment": Augment(size=(8, 8), train=False)}
made_before_fit = Loader(packed, 4, **options)  # every process makes it before fit starts DDP

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net, self.fed = nn.Linear(3 * 8 * 8, 2), []

    def train_dataloader(self):  # made in the hook: after Lightning started the processes
        return Loader(packed, 4, **options)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.fed += [[int(c), round(float(s), 3)] for c, s in zip(y, x.double().sum((1, 2, 3)))]
        return nn.functional.cross_entropy(self.net(x.flatten(1)), y)

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

module = Tiny()
trainer = pl.Trainer(
    max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(module)
rank = trainer.global_rank
(out / f"fed{rank}.json").write_text(json.dumps(module.fed))
try:
    trainer.validate(module, dataloaders=made_before_fit, verbose=False)
except Exception as e:
    (out / f"refused{rank}.txt").write_text(f"{type(e).__name__}: {e}")
"""


@pytest.mark.slow
def test_under_lightning_ddp_a_loader_splits_by_rank_or_says_where_to_make_it(
    packed: Path, tmp_path: Path
) -> None:
    # Trainer(devices=2) runs the script again for rank 1, after starting DDP in rank 0. A Loader
    # made in a hook splits the data by rank itself (no sampler injected, with the default
    # use_distributed_sampler=True); one made before fit, for another rank, is refused.
    import json
    import subprocess
    import sys

    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP_FIT)
    out = tmp_path / "out"
    out.mkdir()
    cp = subprocess.run(
        [sys.executable, str(script), str(packed), str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    files = [out / f"fed{rank}.json" for rank in (0, 1)]
    assert all(f.exists() for f in files), cp.stderr[-3000:]
    fed = [json.loads(f.read_text()) for f in files]
    assert len(fed[0]) == len(fed[1]) == 12
    assert sorted(map(tuple, fed[0] + fed[1])) == sorted(_in_order(packed))  # disjoint halves
    # rank 0 (its Loader was made before DDP started: rank 0 of 1) stops the others on the error
    refused = (out / "refused0.txt").read_text()
    assert refused.startswith("RankMismatch: gpufeed Loader: made for rank 0 of 1 but iterated ")
    assert "*_dataloader() hook" in refused
