"""What `gpufeed tune` found: each `Trial` and the `TuneResult` (the winner, judged against the
noise of the repeats), written as the settings JSON that `load_settings` reads, and printed as the
trials' table (`__rich__`)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.advise.measure import DEFAULT_AUGMENT_LOAD, WAITING, recipe_name
from gpufeed.data.settings import SETTING_KEYS
from gpufeed.text import count

if TYPE_CHECKING:
    from rich.console import Group

    from gpufeed.advise.offload import OffloadAdvice


@dataclass(frozen=True)
class Trial:
    """One loader configuration (Loader keyword arguments) and its measured images/s."""

    batch_size: int
    num_workers: int
    prefetch: int
    preprocess: str
    images_per_s: float = math.nan
    note: str = ""
    spread: float = math.nan  # (max - min) / median of the repeats
    data_wait_share: float = math.nan  # end to end with a model: share of step time waiting
    decoder: str = "auto"  # "nvimgcodec": the CPU workers decode only each crop box

    def settings(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SETTING_KEYS}


@dataclass
class TuneResult:
    """Every trial in order (the default first), the winner, and the model's rate if measured."""

    data: str
    device: str
    image_size: int
    trials: list[Trial]
    model: str | None = None
    model_images_per_s: float | None = None
    stopped_early: bool = False
    out: Path | None = None
    notes: list[str] = field(default_factory=list)
    offload: OffloadAdvice | None = None  # would a Ray cluster's CPU nodes help (advise/offload.py)
    augment_load: int = DEFAULT_AUGMENT_LOAD  # the trials' augmentation (measure.recipe)

    def __rich__(self) -> Group:
        """The trials as a table (the winner in bold), the early stop, where the settings went and
        the offload advice."""
        return _render(self)

    @property
    def default(self) -> Trial | None:
        """The trial of the Loader's defaults; None where a limit refused it (the speedups then
        have no baseline, rather than another trial's)."""
        return next((t for t in self.trials if t.note == "default"), None)

    @property
    def best(self) -> Trial:
        """The fastest trial that beats the default by more than their noise (half the larger
        spread of their repeats) or ends its data wait, else the default: a lead within the
        noise is no reason to change a setting."""
        base = self.default
        if base is None:
            return max(self.trials, key=lambda t: t.images_per_s)
        clear = [t for t in self.trials if t is base or _beats(t, base)]
        return max(clear, key=lambda t: t.images_per_s)

    def to_json(self) -> str:
        from gpufeed.cores import cores_per_rank
        from gpufeed.hardware import describe, hardware
        from gpufeed.text import finite

        return json.dumps(
            {
                "loader": self.best.settings(),
                "images_per_s": self.best.images_per_s,
                "default_images_per_s": self.default.images_per_s if self.default else None,
                "model": self.model,
                "model_images_per_s": self.model_images_per_s,
                "stopped_early": self.stopped_early,
                "data": self.data,
                "device": self.device,
                "image_size": self.image_size,
                "augment_load": self.augment_load,
                "hardware": describe(hardware()),
                "cores_per_rank": cores_per_rank(),  # what num_workers was tuned for
                # strict JSON: a figure not measured (NaN) is null
                "trials": [
                    {k: finite(v) if isinstance(v, float) else v for k, v in asdict(t).items()}
                    for t in self.trials
                ],
                "notes": self.notes,
            },
            indent=2,
        )


def _beats(trial: Trial, base: Trial) -> bool:
    """`trial`'s median is above `base`'s by more than half the larger spread of the two, or,
    trained end to end, it ends the data wait `base` has and is no slower."""
    if trial.data_wait_share < WAITING <= base.data_wait_share:  # NaN (no model): never
        return trial.images_per_s >= base.images_per_s
    noise = max((x for x in (trial.spread, base.spread) if math.isfinite(x)), default=0.0)
    return trial.images_per_s > base.images_per_s * (1 + noise / 2)


def described(trial: Trial) -> str:
    """'4 workers, prefetch 2, cpu, batch 64' (and the decoder, where it is not the default)."""
    decoder = "" if trial.decoder == "auto" else f", decoder {trial.decoder}"
    workers = count(trial.num_workers, "worker")
    return (
        f"{workers}, prefetch {trial.prefetch}, {trial.preprocess}{decoder}, "
        f"batch {trial.batch_size}"
    )


def _render(result: TuneResult) -> Group:
    """`TuneResult.__rich__`: what `gpufeed tune` prints at the end."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []

    best, base = result.best, result.default
    trials = result.trials
    # a setting no trial changed goes in the title, so the table fits an 80-column terminal
    fixed = {
        name: values.pop()
        for name, values in (
            ("batch", {t.batch_size for t in trials}),
            ("preprocess", {t.preprocess for t in trials}),
            ("decoder", {t.decoder for t in trials}),
        )
        if len(values) == 1
    }
    if fixed.get("decoder") == "auto":  # the default everywhere: nothing to say
        del fixed["decoder"]
    title = f"gpufeed tune: {result.data} · {recipe_name(result.augment_load)}"
    title += "".join(f" · {k} {v}" for k, v in fixed.items())
    # run strings (paths, error messages in the notes) are Text, never read as markup
    parts.append(Text(title))  # as wide as the terminal, not the table
    table = Table(box=box.SIMPLE_HEAVY, show_edge=False, collapse_padding=True)
    cols = ["#", "workers", "prefetch", "preprocess", "decoder", "batch", "images/s", "±"]
    cols = [c for c in [*cols, "speedup"] if c not in fixed]
    if len({t.decoder for t in trials}) == 1:
        cols.remove("decoder")
    for col in cols:
        left = col in ("preprocess", "decoder")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    table.add_column("", no_wrap=True)  # "default" (the row speedups compare with), "← best"
    for i, t in enumerate(trials, 1):
        cells = {
            "#": str(i),
            "workers": str(t.num_workers),
            "prefetch": str(t.prefetch),
            "preprocess": t.preprocess,
            "decoder": t.decoder,
            "batch": str(t.batch_size),
            "images/s": f"{t.images_per_s:,.0f}",
            "±": f"±{t.spread / 2:.0%}" if math.isfinite(t.spread) else "–",
            "speedup": f"×{t.images_per_s / base.images_per_s:.2f}" if base else "–",
        }
        table.add_row(
            *(cells[c] for c in cols),
            Text(t.note + (" ← best" if t is best else "")),
            style="bold green" if t is best else None,
        )
    parts.append(table)
    if result.model_images_per_s is not None:
        state = (
            "stopped early: trained end to end, the model no longer waits for data"
            if result.stopped_early
            else "trained end to end, the model waits for data in every trial: still input-bound "
            f"(best: waiting {best.data_wait_share:.0%} of the time)"
        )
        parts.append(
            f"model alone: {result.model_images_per_s:,.1f} images/s; images/s above are end to "
            f"end; {state}"
        )
    for n in result.notes:
        parts.append(Text(n, style="dim"))
    if result.out is not None:
        parts.append(Text(f"settings written to {result.out}: Loader(data, **load_settings(path))"))
    if result.offload is not None:
        parts.append(result.offload.text())
    return Group(*parts)
