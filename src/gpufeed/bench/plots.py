"""PNG charts for experiment results (matplotlib, headless Agg backend)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpufeed.extras import MissingExtra, require


def _pyplot(path: Path):
    """pyplot (headless), or None with a warning naming the extra: the results are still saved,
    and a chart an earlier run left at ``path`` is removed (it would show other results)."""
    try:
        matplotlib = require("bench")
    except MissingExtra as e:
        warnings.warn(f"no chart: {e}", RuntimeWarning, stacklevel=3)
        path.unlink(missing_ok=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def line_panels(
    path: Path,
    title: str,
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    xlabel: str,
    ylabel: str,
    hlines: Mapping[str, float] | None = None,
) -> Path | None:
    """One panel per key of ``panels``, each with named (x, y) lines; ``hlines`` adds a dashed
    reference line per panel (e.g. the synthetic-data ceiling)."""
    plt = _pyplot(path)
    if plt is None:
        return None
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    for ax, (name, lines) in zip(axes[0], panels.items(), strict=False):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="o", label=label)
        if hlines and name in hlines:
            ax.axhline(hlines[name], color="grey", linestyle="--", label="synthetic data")
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bars(
    path: Path,
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
) -> Path | None:
    """One panel per series (its name is the y label), one bar per configuration label."""
    plt = _pyplot(path)
    if plt is None:
        return None
    n = max(1, len(series))
    fig, axes = plt.subplots(1, n, figsize=(max(4.5, 1.3 * len(labels)) * n, 3.8), squeeze=False)
    for ax, (name, values) in zip(axes[0], series.items(), strict=False):
        ax.bar(range(len(labels)), [v if v == v else 0.0 for v in values], color="#4477aa")
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize="small")
        ax.set_ylabel(name)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
