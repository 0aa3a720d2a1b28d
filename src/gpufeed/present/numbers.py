"""Numbers as the presenters print them: thousands separators, fixed decimals, a unit, and a
placeholder where a value is missing."""

from __future__ import annotations

from typing import Any

from gpufeed.text import MISSING, count, figure, finite, number, ordinal

__all__ = ["MISSING", "count", "figure", "finite", "number", "ordinal"]


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
