"""`Finding`: what one bottleneck rule concluded about a run, with the numbers that made it conclude so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``evidence`` holds the measured figures, ``est_speedup`` the expected gain (1.8 = 1.8x faster)."""

    rule: str
    severity: Severity
    title: str
    evidence: dict[str, float | int | str] = field(default_factory=dict)
    recommendation: str = ""
    est_speedup: float | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"Finding from rule {self.rule!r}: severity must be one of {SEVERITIES}, "
                f"got {self.severity!r}"
            )
        if self.est_speedup is not None and not self.est_speedup >= 1.0:
            raise ValueError(
                f"Finding from rule {self.rule!r}: est_speedup must be >= 1.0 or None, "
                f"got {self.est_speedup!r}"
            )

    def impact_key(self) -> tuple[int, float]:
        """Sort key, larger first: severity, then estimated speedup (findings without one count as 1.0)."""
        return (SEVERITIES.index(self.severity), self.est_speedup or 1.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (numpy scalars turned into Python numbers)."""
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "evidence": {k: _plain(v) for k, v in self.evidence.items()},
            "recommendation": self.recommendation,
            "est_speedup": None if self.est_speedup is None else round(float(self.est_speedup), 3),
        }


def _plain(value: Any) -> float | int | str:
    if isinstance(value, str | bool):
        return value
    if hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if isinstance(value, float):
        return round(value, 6)
    return value
