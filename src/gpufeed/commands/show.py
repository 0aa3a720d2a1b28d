"""`gpufeed show`: load a run, analyze it once (`analysis.result`) and print the summary with the findings."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from gpufeed.analysis.run import Run


def show(
    runs: str | os.PathLike[str] | list[str],
    console: Console | None = None,
    config: str | os.PathLike[str] | None = None,
    sets: Iterable[str] = (),
) -> Run:
    """Print the summary of a run (one or several run directories read as one) and its findings,
    judged with the thresholds `gpufeed report` uses: `config` (else ./gpufeed.toml) and `sets`."""
    from gpufeed.analysis.config import resolve
    from gpufeed.analysis.result import analyze_run
    from gpufeed.analysis.run import load
    from gpufeed.present.terminal import print_run

    overrides = resolve(config, sets)
    run = load(runs)
    print_run(run, analyze_run(run, overrides), console)
    return run
