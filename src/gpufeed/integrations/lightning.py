"""PyTorch Lightning: ``Trainer(callbacks=[GpufeedCallback()])`` profiles the fit and writes the report.

Works with the ``lightning`` package and with ``pytorch_lightning`` (the callback derives from the
one installed, ``lightning`` first). Each process of a multi-GPU fit records its own steps; launch
those under ``gpufeed profile -- ...`` so that all ranks share one run directory.
"""

from __future__ import annotations

from typing import Any

from gpufeed.extras import require
from gpufeed.integrations.fit import ProfiledFit


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            require("lightning")  # raises MissingExtra naming the extra
            raise
    return Callback


class GpufeedCallback(ProfiledFit, _callback_base()):  # type: ignore[misc]
    """Profile `trainer.fit` from start to end; the report goes to `run_dir`/report.html.

    Options: out (folder for run directories), name, interval (system sampling, seconds), report.
    """

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._end(write_report=trainer.is_global_zero)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._end(failed=True, write_report=trainer.is_global_zero)
