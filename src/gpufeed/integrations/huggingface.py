"""Hugging Face Transformers: ``Trainer(..., callbacks=[GpufeedCallback()])`` profiles the training and
writes the report when it ends.

Each process of a multi-GPU run records its own steps; launch those under ``gpufeed profile -- ...``
(or ``accelerate launch`` under it) so that all ranks share one run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpufeed.integrations.fit import FitProfiler
from gpufeed.profile.session import DEFAULT_INTERVAL

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "gpufeed's Hugging Face callback needs transformers: pip install 'gpufeed[huggingface]'"
    ) from None


class GpufeedCallback(TrainerCallback):
    """Profile `trainer.train()` from start to end; the report goes to `run_dir`/report.html."""

    def __init__(
        self,
        out: str | os.PathLike[str] | None = None,
        name: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        report: bool = True,
    ) -> None:
        self._fit = FitProfiler(out=out, name=name, interval=interval, report=report)

    @property
    def run_dir(self) -> Path | None:
        """The run directory (None before training starts)."""
        return self._fit.run_dir

    @property
    def report(self) -> Path | None:
        """The report written when training ended (None before, or with report=False)."""
        return self._fit.report

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fit.start()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fit.finish(write_report=state.is_world_process_zero)
