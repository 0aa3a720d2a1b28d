"""`gpufeed ls`: read the meta.json of every run under a folder (its command redacted as
`analysis.run.load` does) and print them, latest first."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def list_runs(out: str | os.PathLike[str], console: Console | None = None) -> list[Path]:
    """Print the run directories under `out` (or `out` itself where it is one), latest start
    time first; returns them."""
    from gpufeed.present.terminal import print_runs
    from gpufeed.profiler.session import META_FILE
    from gpufeed.text import finite

    base = Path(out)
    # a run killed before it wrote meta.json, or whose meta.json was lost, still has store files
    stores = (META_FILE, "steps-*.db", "system-*.db")  # what a run directory holds
    patterns = [*(f"*/{name}" for name in stores), *stores]  # the runs under it, or it
    dirs = {p.parent for pattern in patterns for p in base.glob(pattern)}
    metas = {d: _read_meta(d / META_FILE) for d in dirs}
    # By when each run started; a meta.json without a start time sorts by when it was written.
    runs = sorted(
        metas,
        key=lambda d: finite(metas[d].get("start_time")) or _mtime(d),
        reverse=True,
    )
    print_runs(base, {d: metas[d] for d in runs}, console)
    return runs


def _read_meta(path: Path) -> dict[str, Any]:
    """A meta.json as a dict; where it is missing, unreadable or not an object, {PROBLEM: why} (one
    damaged run must not stop `ls` from listing the others)."""
    from gpufeed.analysis.run import redact_meta
    from gpufeed.present.terminal import PROBLEM

    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {PROBLEM: "no meta.json"}
    except OSError:
        return {PROBLEM: "unreadable meta.json"}
    except ValueError:
        return {PROBLEM: "damaged meta.json"}
    return redact_meta(data) if isinstance(data, dict) else {PROBLEM: "damaged meta.json"}


def _mtime(run_dir: Path) -> float:
    try:
        return os.path.getmtime(run_dir)
    except OSError:
        return 0.0
