"""What `gpufeed diagnose` found: the `Diagnosis` (its measurements, the verdict they give and the
measured alternatives), as JSON for scripts and as the report it prints (`__rich__`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufeed.advise.measure import WAITING, Rate, TrainSettings, recipe_name
from gpufeed.text import count

if TYPE_CHECKING:
    from rich.console import Group

    from gpufeed.advise.offload import OffloadAdvice


@dataclass
class Alternative:
    """A measured way to feed the model faster, and the model's ceiling beside it."""

    name: str
    images_per_s: float
    workers: int | None = None  # its loader workers
    cpu_s_per_image: float = math.nan  # CPU an image cost it, measured alone (data.rate.Rate)
    cluster_pipeline: bool = False  # what Loader(cluster=...) runs (CPU preprocessing)
    threads: int | None = None  # on a CPU device, the torch threads its workers leave the model
    ceiling: float | None = None  # the model alone timed with `threads`; None: the diagnosis's
    trained: Rate | None = None  # GPU preprocessing: the model trained on its batches (together)


@dataclass
class Diagnosis:
    """The two measurements, the verdict they give, and measured alternatives when input-bound."""

    data: str
    loader_desc: str
    model: str
    device: str
    loader: Rate
    model_rate: Rate
    alternatives: list[Alternative] = field(default_factory=list)
    threads: int | None = None  # torch threads of the model measurement on a CPU device
    together: Rate | None = None  # the model trained on the loader's batches
    settings: TrainSettings = field(default_factory=TrainSettings)
    offload: OffloadAdvice | None = None  # would a Ray cluster's CPU nodes help (advise/offload.py)
    augment_load: int | None = None  # the recipe's load (measure.recipe); None: the user's loader
    offload_from: str | None = None  # the pipeline whose CPU per image sized `offload`

    def __rich__(self) -> Group:
        """The two measurements, the verdict, the alternatives as a table and the offload advice."""
        return _render(self)

    @property
    def end_to_end(self) -> float:
        """Images/s of the job as it would run: together, else the slower side alone."""
        if self.together is not None:
            return self.together.images_per_s
        return min(self.loader.images_per_s, self.model_rate.images_per_s)

    @property
    def ceiling_share(self) -> float:
        """End-to-end images/s as a share of the model-alone ceiling (capped at 1)."""
        return min(1.0, self.end_to_end / self.model_rate.images_per_s)

    @property
    def input_bound(self) -> bool:
        if self.together is not None and math.isfinite(self.together.data_wait_share):
            return self.together.data_wait_share >= WAITING
        return self.loader.images_per_s < self.model_rate.images_per_s

    @property
    def verdict(self) -> str:
        return "input-bound" if self.input_bound else "compute-bound"

    @property
    def ratio(self) -> float:
        """How many times faster the faster side is than the slower one."""
        a, b = self.loader.images_per_s, self.model_rate.images_per_s
        return max(a, b) / min(a, b)

    def ceiling_beside(self, a: Alternative) -> float:
        """Images/s of the model alone beside alternative `a`: what its verdict compares with."""
        return self.model_rate.images_per_s if a.ceiling is None else a.ceiling

    def verdict_with(self, a: Alternative) -> str:
        """The verdict the job would get with alternative `a` as its loader: from training on it
        where that was measured (as the job's own verdict), else from its rate alone."""
        if a.trained is not None and math.isfinite(a.trained.data_wait_share):
            return "input-bound" if a.trained.data_wait_share >= WAITING else "compute-bound"
        return "input-bound" if a.images_per_s < self.ceiling_beside(a) else "compute-bound"

    def offload_text(self) -> str:
        """The offload advice's line, naming the pipeline whose CPU per image sized it."""
        assert self.offload is not None
        text = self.offload.text()
        return f"{text}; CPU/image measured on {self.offload_from}" if self.offload_from else text

    @property
    def gpu_idle_share(self) -> float:
        """Share of time the accelerator waits for data: 1 − end-to-end / ceiling."""
        return 1.0 - self.ceiling_share

    def to_dict(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "loader": self.loader_desc,
            "augment_load": self.augment_load,
            "model": self.model,
            "device": self.device,
            "threads": self.threads,
            "loader_images_per_s": self.loader.images_per_s,
            "model_images_per_s": self.model_rate.images_per_s,
            "together_images_per_s": self.together.images_per_s if self.together else None,
            "ceiling_share": self.ceiling_share,
            "together_data_wait_share": self.together.data_wait_share if self.together else None,
            "settings": vars(self.settings),
            "batch_shape": list(self.loader.batch_shape),
            "verdict": self.verdict,
            "ratio": self.ratio,
            "gpu_idle_share": self.gpu_idle_share,
            "alternatives": [_alternative_dict(a) for a in self.alternatives],
            "offload": None if self.offload is None else _offload_dict(self),
        }


def _alternative_dict(a: Alternative) -> dict[str, Any]:
    """An alternative's fields, with what training on it measured as two numbers."""
    out = {k: v for k, v in vars(a).items() if k != "trained"}
    out["trained_images_per_s"] = a.trained.images_per_s if a.trained else None
    out["trained_data_wait_share"] = a.trained.data_wait_share if a.trained else None
    return out


def _offload_dict(d: Diagnosis) -> dict[str, Any]:
    """The offload advice's inputs, conclusions, the pipeline it was sized from and its line."""
    advice = d.offload
    assert advice is not None
    return {
        "cpu_s_per_image": advice.cpu_s_per_image,
        "model_images_per_s": advice.model_images_per_s,
        "host_cores": advice.host_cores,
        "image_bytes": advice.image_bytes,
        "data_wait_share": advice.data_wait_share,
        "cores_needed": advice.cores_needed,
        "helps": advice.helps,
        "remote_cores": advice.remote_cores,
        "network_bytes_per_s": advice.network_bytes_per_s,
        "sized_from": d.offload_from,
        "text": d.offload_text(),
    }


def _trained_cell(trained: Rate | None, ceiling: float) -> str:
    """'3,606.0 (77% of the model alone)', or '—' where it was not trained on."""
    if trained is None:
        return "—"
    return f"{trained.images_per_s:,.1f} ({trained.images_per_s / ceiling:.0%} of the model alone)"


def _render(d: Diagnosis) -> Group:
    """`Diagnosis.__rich__`: what `gpufeed diagnose` prints at the end."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    parts: list[Any] = []

    shape = "×".join(str(x) for x in d.loader.batch_shape)
    title = f"gpufeed diagnose: {escape(d.data)}"
    if d.augment_load is not None:
        title += f" · {recipe_name(d.augment_load)}"
    table = Table(title=title, title_justify="left")
    table.add_column("measured")
    table.add_column("images/s", justify="right")
    table.add_row(f"loader alone: {escape(d.loader_desc)}", f"{d.loader.images_per_s:,.1f}")
    table.add_row(
        f"model alone (the ceiling): {escape(d.model)} on {d.device}"
        + (f" ({count(d.threads, 'thread')})" if d.threads else "")
        + f", batch {shape}, {d.settings.describe()}",
        f"{d.model_rate.images_per_s:,.1f}",
    )
    if d.together is not None:
        table.add_row("both together (end to end)", f"{d.together.images_per_s:,.1f}")
    parts.append(table)
    color = "red" if d.input_bound else "green"
    accel = "GPU" if d.device == "cuda" else "accelerator"
    if d.input_bound:
        why = (
            "the loader alone is slower than the model"
            if d.loader.images_per_s < d.model_rate.images_per_s
            else "each is fast alone, but together they stall (CPU, copies, memory bandwidth)"
        )
        text = f"training runs at {d.ceiling_share:.0%} of the model's ceiling"
        if d.together is not None and math.isfinite(d.together.data_wait_share):
            text += f", its steps wait for data {d.together.data_wait_share:.0%} of the time"
        text += f": {why}"
    else:
        text = (
            f"training reaches {d.ceiling_share:.0%} of the model's ceiling: the model is the limit"
        )
    parts.append(
        f"[bold {color}]{d.verdict.upper()}[/]: {text}"
        + (f"; the {accel} idles about {d.gpu_idle_share:.0%} of the time" if d.input_bound else "")
    )
    if d.alternatives:
        title = "Measured alternatives (images/s: the loader alone)"
        alt = Table(title=title, title_justify="left")
        alt.add_column("alternative")
        alt.add_column("images/s", justify="right")
        alt.add_column("vs now", justify="right")
        beside = any(a.threads is not None for a in d.alternatives)
        if beside:  # a CPU device: the model trains with the threads the workers leave
            alt.add_column("model beside its workers", justify="right")
        trained = any(a.trained is not None for a in d.alternatives)
        if trained:  # GPU preprocessing: the model trained on its batches
            alt.add_column("trained on it", justify="right")
        alt.add_column("verdict with it")
        for a in d.alternatives:
            row = [
                escape(a.name),
                f"{a.images_per_s:,.1f}",
                f"×{a.images_per_s / d.loader.images_per_s:.2f}",
            ]
            if beside:
                threads = f" ({count(a.threads, 'thread')})" if a.threads else ""
                row.append(f"{d.ceiling_beside(a):,.1f}{threads}")
            if trained:
                row.append(_trained_cell(a.trained, d.model_rate.images_per_s))
            alt.add_row(*row, d.verdict_with(a))
        parts.append(alt)
    elif d.input_bound:
        parts.append("  no alternative applies to this loader")
    if d.offload is not None:
        parts.append(d.offload_text())
    return Group(*parts)
