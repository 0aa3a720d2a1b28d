"""`--headspace N`: the job's own ceiling, measured. After warm-up (`HEADSPACE_AFTER` training
steps) one batch of the training iterator is kept, and the next N steps are fed that batch again
and again without asking the loader: their step time is this model's and loop's without input.

Those steps train on a repeated batch (off by default). Only the iterator that fed the previous
training step is replayed: a validation pass during the window reads its own data. The window is
counted in optimizer steps, so every rank of a DDP job replays the same steps.
"""

from __future__ import annotations

import os
from typing import Any

from gpufeed.profiler.session import ENV_HEADSPACE, HEADSPACE_AFTER, check_headspace, warn_once

NOTHING: Any = object()  # no batch to replay: ask the loader


class Headspace:
    """Which steps are replayed and with what; `window` is (first, last) step once a batch is kept."""

    def __init__(self, steps: int, after: int = HEADSPACE_AFTER) -> None:
        self.steps = steps
        self.after = after
        self.window: tuple[int, int] | None = None
        self.train_serial: int | None = None  # the iterator that fed the last training step
        self._batch: Any = NOTHING
        self._serial: int | None = None

    def replay(self, step: int, serial: int) -> Any:
        """The kept batch while `step` is replayed and `serial` names the iterator it came from;
        else NOTHING. Past the window the batch is let go (its memory, a loader's slot)."""
        window = self.window
        if window is None or serial != self._serial:
            return NOTHING
        if step > window[1]:
            self._batch = NOTHING
            return NOTHING
        return self._batch if step >= window[0] else NOTHING

    def offer(self, step: int, serial: int, batch: Any) -> None:
        """A batch the loader delivered during `step`: kept, and the window set, where it is the
        first one from the training iterator after warm-up."""
        if self.window is None and step >= self.after and serial == self.train_serial:
            self._batch, self._serial = batch, serial
            self.window = (step + 1, step + self.steps)

    def step_ended(self, events: list[tuple], models: frozenset[int] | None) -> None:
        """Note which iterator fed the step that just ended (see `training_iterator`)."""
        serial = training_iterator(events, models)
        if serial is not None:
            self.train_serial = serial


def training_iterator(events: list[tuple], models: frozenset[int] | None) -> int | None:
    """The iterator (serial) whose batch a step's training forward took: the last batch fetched
    before the first forward of a model with grad on and in train mode (else the last batch
    fetched, where no model forward was seen); None where the step fetched none."""
    last = None
    for e in events:
        if e[0] == "f" and e[3] is not None:
            last = e[4]
        elif (
            e[0] == "F"
            and e[5]
            and e[6]
            and last is not None
            and (models is None or e[4] in models)
        ):
            return last
    return last


def headspace_asked() -> Headspace | None:
    """The replay this process was asked for ($GPUFEED_HEADSPACE, set by `gpufeed profile
    --headspace`), None if none; a value that is not a step count warns once and is ignored."""
    asked = os.environ.get(ENV_HEADSPACE)
    if not asked:
        return None
    try:
        steps = check_headspace(asked)
    except ValueError as e:
        warn_once("headspace", f"{e} (${ENV_HEADSPACE}); no steps are replayed")
        return None
    return Headspace(steps) if steps else None
