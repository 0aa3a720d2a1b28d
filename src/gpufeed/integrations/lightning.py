"""PyTorch Lightning: ``Trainer(callbacks=[GpufeedCallback()])`` profiles the fit and writes the report.

Works with the ``lightning`` package and with ``pytorch_lightning`` (the callback derives from the
one installed, ``lightning`` first). Each process of a multi-GPU fit records its own steps; launch
those under ``gpufeed profile -- ...`` so that all ranks share one run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpufeed.integrations.fit import FitProfiler
from gpufeed.profile.session import DEFAULT_INTERVAL


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError(
                "gpufeed's Lightning callback needs PyTorch Lightning: "
                "pip install 'gpufeed[lightning]' (or lightning)"
            ) from None
    return Callback


class GpufeedCallback(_callback_base()):  # type: ignore[misc]
    """Profile `trainer.fit` from start to end; the report goes to `run_dir`/report.html."""

    def __init__(
        self,
        out: str | os.PathLike[str] | None = None,
        name: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        report: bool = True,
    ) -> None:
        super().__init__()
        self._fit = FitProfiler(out=out, name=name, interval=interval, report=report)

    @property
    def run_dir(self) -> Path | None:
        """The run directory (None before the fit starts)."""
        return self._fit.run_dir

    @property
    def report(self) -> Path | None:
        """The report written at the fit's end (None before, or with report=False)."""
        return self._fit.report

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._fit.start()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._fit.finish(write_report=trainer.is_global_zero)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._fit.finish(failed=True, write_report=trainer.is_global_zero)
