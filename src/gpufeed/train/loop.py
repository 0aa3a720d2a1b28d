"""`fit`: the training loop a performance-minded user writes, with throughput measured honestly.

AMP (bf16, or fp16 with a GradScaler), channels_last, optional ``torch.compile``, DDP under torchrun,
and a synthetic-data mode (one batch resident on the device) that gives the model-only ceiling.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpufeed.devices import default_device
from gpufeed.text import count

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
OPTIMIZERS = ("sgd", "adam")


@dataclass
class SyntheticData:
    """One random batch, created once on the training device and fed ``steps`` times per epoch.

    Training on it measures what the model alone can do: no decoding, no copies, no waiting.
    Images are ``image_size`` square, or ``image_size`` high and ``image_width`` wide.
    """

    batch_size: int
    image_size: int = 224
    num_classes: int = 1000
    steps: int = 100
    image_width: int | None = None

    def __post_init__(self) -> None:
        if self.image_width is None:
            self.image_width = self.image_size
        for name in ("batch_size", "image_size", "num_classes", "steps", "image_width"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"SyntheticData.{name} must be at least 1, got {getattr(self, name)}"
                )

    def __len__(self) -> int:
        return self.steps

    def resident(self, device: torch.device, channels_last: bool = False) -> _ResidentBatch:
        """The batch, materialised on ``device`` (in channels_last layout if asked)."""
        gen = torch.Generator().manual_seed(0)
        shape = (self.batch_size, 3, self.image_size, self.image_width)
        images = torch.randn(*shape, generator=gen)
        labels = torch.randint(0, self.num_classes, (self.batch_size,), generator=gen)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return _ResidentBatch(images.to(device), labels.to(device), self.steps)


@dataclass
class _ResidentBatch:
    images: torch.Tensor
    labels: torch.Tensor
    steps: int

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            yield self.images, self.labels

    def __len__(self) -> int:
        return self.steps


@dataclass
class FitResult:
    """What a `fit` call did and how fast. Times are host seconds; throughput excludes warm-up."""

    steps: int
    epochs: int
    samples: int
    seconds: float
    images_per_s: float
    total_images_per_s: float
    measured_steps: int
    final_loss: float
    world_size: int = 1
    step_times: list[float] = field(default_factory=list, repr=False)
    data_waits: list[float] = field(default_factory=list, repr=False)

    @property
    def data_wait_fraction(self) -> float:
        """Share of step time spent blocked on the input pipeline (0 when it never waits)."""
        total = sum(self.step_times)
        return sum(self.data_waits) / total if total > 0 else 0.0

    @property
    def median_step_time(self) -> float:
        """Median seconds per step (NaN when no step ran)."""
        return statistics.median(self.step_times) if self.step_times else float("nan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _default_device() -> torch.device:
    if dist.is_available() and dist.is_initialized() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(default_device())


def _make_optimizer(
    model: nn.Module, optimizer: str | torch.optim.Optimizer, lr: float, momentum: float, wd: float
) -> torch.optim.Optimizer:
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    name = optimizer.lower()
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
    raise ValueError(f"unknown optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")


def _split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, dict) and {"images", "labels"} <= batch.keys():
        return batch["images"], batch["labels"]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(
        f"the loader yielded a {type(batch).__name__}; fit() needs (images, labels) pairs "
        "or dicts with 'images' and 'labels'"
    )


STOP_CHECK_EVERY = 10  # steps between the ranks' agreement on stopping for max_seconds


def _for_collectives(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` where the process group's collectives take it: on the device under NCCL."""
    return t.to(device) if dist.get_backend() == "nccl" else t


def _any_rank(mine: bool, step: int, device: torch.device) -> bool:
    """Under DDP: whether any rank's time is up, agreed on every `STOP_CHECK_EVERY` steps (the
    ranks step together, so all check at the same step); False between checks. Ranks that
    stopped at different steps would pair one's last all-reduce with another's gradients."""
    if step % STOP_CHECK_EVERY:
        return False
    flag = _for_collectives(torch.tensor([1.0 if mine else 0.0]), device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def fit(
    model: nn.Module,
    loader: Iterable[Any] | SyntheticData,
    *,
    epochs: int = 1,
    steps: int | None = None,
    optimizer: str | torch.optim.Optimizer = "sgd",
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 5e-5,
    amp: str | None = None,
    channels_last: bool = False,
    compile: bool = False,
    device: torch.device | str | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    warmup: int = 3,
    max_seconds: float | None = None,
    log_every: int = 50,
    verbose: bool = True,
) -> FitResult:
    """Train ``model`` on ``loader`` (``(images, labels)`` batches) and measure its throughput.

    ``steps`` caps the total number of steps, ``max_seconds`` the wall time after the ``warmup``
    steps, which always run (torch.compile's compilation or cuDNN's autotuning may take longer;
    under DDP every rank stops at the same step, the first check after any rank's time is up);
    under torchrun the model
    is wrapped in DDP (call `setup_distributed` first). Throughput counts the steps after ``warmup``.
    A loader that keeps its own position (gpufeed's Loader: ``state_dict``) goes on from it, a
    restored one resumes; another with ``set_epoch`` is given epochs 0, 1, ...
    """
    if amp is not None and amp not in AMP_DTYPES:
        raise ValueError(f"unknown amp mode {amp!r}: choose one of {', '.join(AMP_DTYPES)} or None")
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    device = torch.device(device) if device is not None else _default_device()
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    world_size = dist.get_world_size() if distributed else 1
    is_main = not distributed or dist.get_rank() == 0

    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = _make_optimizer(model, optimizer, lr, momentum, weight_decay)
    train_model: nn.Module = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        train_model = DistributedDataParallel(model, device_ids=ids)
    if compile:
        train_model = torch.compile(train_model)  # type: ignore[assignment]
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    autocast_dtype = AMP_DTYPES.get(amp) if amp else None
    data: Iterable[Any] = (
        loader.resident(device, channels_last) if isinstance(loader, SyntheticData) else loader
    )
    log = _Logger(verbose and is_main, log_every)

    train_model.train()
    step_times: list[float] = []
    data_waits: list[float] = []
    samples = measured_samples = measured_steps = 0
    measure_start: float | None = None
    loss = torch.zeros((), device=device)
    t_begin = time.perf_counter()
    epoch = 0
    done = False
    stateful = hasattr(data, "state_dict") and hasattr(data, "load_state_dict")
    for epoch in range(epochs):
        if stateful:  # on from where it is, also mid-epoch (a fit(steps=N) before this one)
            data.load_state_dict(data.state_dict())
        elif hasattr(data, "set_epoch"):
            data.set_epoch(epoch)
        it = iter(data)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            images, labels = _split_batch(batch)
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            if channels_last and images.dim() == 4:  # N×C×H×W: other inputs have no such layout
                images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(
                device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = loss_fn(train_model(images), labels)
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            t2 = time.perf_counter()
            n = int(images.shape[0])
            step_times.append(t2 - t0)
            data_waits.append(t1 - t0)
            samples += n
            if len(step_times) == warmup:
                _sync(device)
                measure_start = time.perf_counter()
            elif measure_start is not None:
                measured_samples += n
                measured_steps += 1
            log.step(len(step_times), epoch, loss, step_times, data_waits, n)
            # the clock of max_seconds starts after the warm-up (compilation can take minutes)
            since = measure_start if warmup > 0 else t_begin
            out_of_time = (
                max_seconds is not None and since is not None and t2 - since >= max_seconds
            )
            if distributed and max_seconds is not None:
                out_of_time = _any_rank(out_of_time, len(step_times), device)
            if (steps is not None and len(step_times) >= steps) or out_of_time:
                done = True
                break
        if done:
            break
    _sync(device)
    t_end = time.perf_counter()
    if not step_times:  # a misconfigured loader, not a measurement of 0 images/s
        raise ValueError(
            "the loader yielded no batch: nothing was trained (an empty data set, or a "
            "drop_last loader with fewer samples than one batch?)"
        )
    if measure_start is None or measured_samples == 0:  # too few steps to skip warm-up: count all
        measure_start, measured_samples, measured_steps = t_begin, samples, len(step_times)
    elapsed = max(t_end - measure_start, 1e-9)
    rate = measured_samples / elapsed
    total_rate = rate
    if distributed:
        totals = torch.tensor([float(measured_samples), elapsed], dtype=torch.float64)
        totals = _for_collectives(totals, device)
        dist.all_reduce(totals[:1])
        slowest = totals[1:].clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        total_rate = float(totals[0]) / max(float(slowest[0]), 1e-9)
    result = FitResult(
        steps=len(step_times),
        epochs=epoch + 1,
        samples=samples,
        seconds=t_end - t_begin,
        images_per_s=rate,
        total_images_per_s=total_rate,
        measured_steps=measured_steps,
        final_loss=float(loss.detach().float().item()),
        world_size=world_size,
        step_times=step_times,
        data_waits=data_waits,
    )
    log.summary(result)
    return result


class _Logger:
    """Rich throughput lines every ``every`` steps, on the main process only."""

    def __init__(self, enabled: bool, every: int):
        self.enabled = enabled and every > 0
        self.every = every
        self._console = None
        if self.enabled:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)

    def step(
        self,
        step: int,
        epoch: int,
        loss: torch.Tensor,
        step_times: list[float],
        data_waits: list[float],
        batch: int,
    ) -> None:
        if not self.enabled or step % self.every:
            return
        recent = step_times[-self.every :]
        wait = sum(data_waits[-self.every :]) / max(sum(recent), 1e-9)
        rate = batch * len(recent) / max(sum(recent), 1e-9)
        assert self._console is not None
        self._console.print(
            f"[bold]step {step}[/] epoch {epoch} · loss {loss.item():.3f} · "
            f"{rate:,.0f} img/s · data wait {wait:.0%}",
            soft_wrap=True,
        )

    def summary(self, r: FitResult) -> None:
        if not self.enabled:
            return
        assert self._console is not None
        ranks = (
            f" × {r.world_size} ranks = {r.total_images_per_s:,.1f} img/s"
            if r.world_size > 1
            else ""
        )
        self._console.print(
            f"[bold green]done[/] {r.steps} steps, {count(r.epochs, 'epoch')} "
            f"in {r.seconds:.1f} s · "
            f"{r.images_per_s:,.1f} img/s{ranks} · data wait {r.data_wait_fraction:.0%} · "
            f"final loss {r.final_loss:.3f}",
            soft_wrap=True,
        )
