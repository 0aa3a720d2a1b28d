"""Top-level `gpufeed.load` and `gpufeed.analyze`; imports pandas only when called (`load`'s
docstring, built here from the schema table, is plain Python)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufeed.analysis.schema import frames_text

if TYPE_CHECKING:
    from collections.abc import Iterable
    from os import PathLike

    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.run import Run


def load(path: str | PathLike[str] | Iterable[str | PathLike[str]]) -> Run:
    """Load a run directory (also one still being written) as pandas frames; several directories
    (a list or a glob pattern: one per host of a multi-node job) load as one run.

    The returned `Run` holds the frames below (the table in `gpufeed.analysis.schema`)."""
    from gpufeed.analysis.run import load as _load

    return _load(path)


def _with_schema(doc: str | None) -> str:
    """`doc` (its continuation lines dedented) followed by the schema table, so that
    `help(gpufeed.load)` shows every frame's columns, units and meanings."""
    first, *rest = (doc or "").split("\n")
    lines = [first.strip(), *(line.removeprefix("    ") for line in rest)]
    return "\n".join(lines) + "\n\n" + frames_text()


load.__doc__ = _with_schema(load.__doc__)


def analyze(run: Run | str | PathLike[str], **overrides: Any) -> list[Finding]:
    """Run every built-in rule on a run and return its findings, most impactful first."""
    from gpufeed.analysis.rules import run_rules

    if not hasattr(run, "steps"):
        run = load(run)  # type: ignore[arg-type]
    return run_rules(run, **overrides)
