"""Numbers as the presenters print them: thousands separators, fixed decimals, a unit, and a
placeholder where a value is missing."""

from __future__ import annotations

import math
from typing import Any

MISSING = "–"


def number(value: float | None, digits: int = 0, unit: str = "", missing: str = MISSING) -> str:
    """`value` with thousands separators, `digits` decimals and `unit`; `missing` where it is None,
    NaN or infinite."""
    if value is None or not math.isfinite(value):
        return missing
    return f"{value:,.{digits}f}{unit}"


def figure(value: float | None, unit: str = "", missing: str = MISSING) -> str:
    """`value` with about three significant digits, whatever its size: "0.45", "11.3", "1,234"
    (a rate of 0.45 steps/s is not "0")."""
    if value is None or not math.isfinite(value):
        return missing
    size = abs(value)
    return number(value, 2 if size < 10 else 1 if size < 100 else 0, unit)


def count(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless n is 1: "1 step", "3 steps", "2 classes"."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


def ordinal(n: int) -> str:
    """`n` as an ordinal: "2nd", "3rd", "11th", "21st"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def finite(value: object) -> float | None:
    """A value read from a file (meta.json) as a float where it is a finite number, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def cpu_counts(meta: dict) -> str:
    """The run's logical cores: "16", or each host's in host order ("16 + 8") where the hosts of a
    combined run differ; "?" when not recorded."""
    per_host = meta.get("host_cpu_counts") or {}
    counts = [per_host[h] for h in meta.get("hosts") or [] if h in per_host]
    if len(set(counts)) > 1:
        return " + ".join(str(n) for n in counts)
    return str(meta.get("cpu_count") or "?")


def after_warmup(steady: tuple[int, float] | None, ranks: int) -> str:
    """The data wait the findings judge, said beside the share over every step: "37.8% after the
    5 warm-up steps the findings leave out"; "" where no warm-up was left out."""
    if steady is None or steady[0] <= 0:
        return ""
    each = " of each rank" if ranks > 1 else ""
    return (
        f"{number(100 * steady[1], 1, '%')} after the {count(steady[0], 'warm-up step')}{each} "
        "the findings leave out"
    )


def damaged_text(damaged: list[str]) -> str:
    """The line that says which store files of a run could not be read and are left out."""
    files = "; ".join(damaged)
    return (
        f"{count(len(damaged), 'store file')} could not be read and "
        f"{'is' if len(damaged) == 1 else 'are'} left out: {files}; the figures miss what "
        f"{'it' if len(damaged) == 1 else 'they'} recorded"
    )


def ceiling_text(ceiling: Any, meta: dict) -> str:
    """The job's share of its own ceiling (an `analysis.headspace.Ceiling`), said in one line; why
    it is missing where `--headspace` asked for it and nothing was measured; else ""."""
    if ceiling is None:
        if not meta.get("headspace"):
            return ""
        return (
            f"not measured: --headspace {meta['headspace']} found no training batch from a "
            "DataLoader (or gpufeed Loader) to keep after warm-up, or the run ended first"
        )
    return (
        f"the steps run at {number(100 * ceiling.share, 0, '%')} of this job's speed without "
        f"input: {figure(1e3 * ceiling.ceiling_step, ' ms')} a step fed one kept batch "
        f"({count(ceiling.replayed_steps, 'step')}, --headspace) against "
        f"{figure(1e3 * ceiling.real_step, ' ms')} as it runs (medians), so feeding it faster "
        f"gives up to ×{ceiling.speedup:.2f}"
    )
