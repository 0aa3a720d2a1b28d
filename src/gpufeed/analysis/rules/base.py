"""`Rule`: what every bottleneck rule declares (id, documented parameters: `params.Param`) and implements (check)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from gpufeed.analysis.rules.params import ENABLED, Param

if TYPE_CHECKING:
    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.rules.context import Context


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
