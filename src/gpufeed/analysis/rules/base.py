"""`Rule` and `Param`: what every bottleneck rule declares (id, documented parameters) and implements (check)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.rules.context import Context


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


class Rule:
    """Base class of the built-in rules: subclasses set `id`, `params`, a docstring, and implement `check`."""

    id: ClassVar[str]
    params: ClassVar[dict[str, Param]] = {}
    # One line on what the rule does where no GPU was read (NVML absent): shown by `gpufeed rules`.
    cpu_only: ClassVar[str] = ""

    @classmethod
    def all_params(cls) -> dict[str, Param]:
        """The rule's parameters plus the common `enabled` switch."""
        return {**cls.params, "enabled": ENABLED}

    @classmethod
    def summary(cls) -> str:
        """First line of the rule's docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0]

    def resolve(self, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
        """Defaults with `overrides` applied; unknown names and bad values raise ValueError naming them."""
        known = self.all_params()
        values = {name: p.default for name, p in known.items()}
        for name, value in (overrides or {}).items():
            if name not in known:
                raise ValueError(
                    f"unknown parameter {self.id}.{name}; {self.id} has: {', '.join(sorted(known))}"
                )
            values[name] = known[name].coerce(value, f"{self.id}.{name}")
        return values

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterable[Finding]:
        """Return the findings for the run in `ctx` under parameters `p` (empty when all is well)."""
        raise NotImplementedError
