"""Hugging Face Transformers: ``Trainer(..., callbacks=[GpufeedCallback()])`` profiles the training and
writes the report when it ends.

Each process of a multi-GPU run records its own steps; launch those under ``gpufeed profile -- ...``
(or ``accelerate launch`` under it) so that all ranks share one run directory. Transformers calls no
callback when training raises: such a run stays unfinished, like a killed one, and still loads.
"""

from __future__ import annotations

from typing import Any

from gpufeed.extras import require
from gpufeed.integrations.fit import ProfiledFit

TrainerCallback = require("huggingface").TrainerCallback


class GpufeedCallback(ProfiledFit, TrainerCallback):
    """Profile `trainer.train()` from start to end; the report goes to `run_dir`/report.html.

    Options: out (folder for run directories), name, interval (system sampling, seconds), report.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._begin()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end(write_report=state.is_world_process_zero)
