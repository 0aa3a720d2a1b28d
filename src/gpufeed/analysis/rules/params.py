"""`Param` and the thresholds several rules and the config share: the lowest module of the rules,
so that `base`, `context`, `shared`, `registry` and `config` all import it and it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufeed.errors import GpufeedError


class ConfigError(GpufeedError, ValueError):
    """A bad threshold override: the message names the file or option, the key, and what to do."""


@dataclass(frozen=True)
class Param:
    """A tunable threshold with its default and a one-line meaning (shown by `gpufeed rules`)."""

    default: float | int | bool
    doc: str
    least: float = 0  # the smallest value that works
    share: bool = False  # a share 0-1, where a percent (10 for 10%) is a mistake

    def coerce(self, value: Any, where: str) -> float | int | bool:
        """Convert a user value (maybe a string from `--set`) to the default's type, or raise ValueError."""
        kind = type(self.default)
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        if isinstance(value, bool):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a number, got {value!r}") from None
        if number != number or number < self.least:
            raise ValueError(f"{where}: expected a number >= {self.least:g}, got {value!r}")
        if self.share and number > 1:
            raise ValueError(f"{where}={value}: expected a share 0–1 (0.1 = 10%)")
        if kind is int:
            if number != int(number):
                raise ValueError(f"{where}: expected a whole number, got {value!r}")
            return int(number)
        return number


# The data-wait share of step time at which steps count as input-bound: the rules that blame the
# input pipeline, and `gpufeed diagnose` / `tune` (advise's WAITING), draw the line at the same place.
INPUT_BOUND = 0.1
# Every rule also accepts `enabled` (e.g. `--set StepOutlier.enabled=false`).
ENABLED = Param(True, "run this rule")
# What rules' GPU-utilization thresholds compare against (NVML utilization.gpu).
GPU_UTIL_P95 = "p95 GPU utilization % (share of time some kernel ran; not SM occupancy)"
