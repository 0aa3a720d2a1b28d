"""Top-level `gpufeed.load` and `gpufeed.analyze`; imports pandas only when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable
    from os import PathLike

    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.run import Run


def load(path: str | PathLike[str] | Iterable[str | PathLike[str]]) -> Run:
    """Load a run directory (also one still being written) as pandas frames; several directories
    (a list or a glob pattern: one per host of a multi-node job) load as one run."""
    from gpufeed.analysis.run import load as _load

    return _load(path)


def analyze(run: Run | str | PathLike[str], **overrides: Any) -> list[Finding]:
    """Run every built-in rule on a run and return its findings, most impactful first."""
    from gpufeed.analysis.rules import run_rules

    if not hasattr(run, "steps"):
        run = load(run)  # type: ignore[arg-type]
    return run_rules(run, **overrides)
