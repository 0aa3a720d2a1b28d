"""`gpufeed ls`: read the meta.json of every run under a folder and print them, latest first."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def list_runs(out: str | os.PathLike[str], console: Console | None = None) -> list[Path]:
    """Print the run directories under `out`, latest start time first; returns them."""
    from gpufeed.present.numbers import finite
    from gpufeed.present.terminal import print_runs
    from gpufeed.profiler.session import META_FILE

    base = Path(out)
    metas = {p.parent: _read_json(p) for p in base.glob(f"*/{META_FILE}")}
    # By when each run started; a meta.json without a start time sorts by when it was written.
    runs = sorted(
        metas,
        key=lambda d: finite(metas[d].get("start_time")) or os.path.getmtime(d / META_FILE),
        reverse=True,
    )
    print_runs(base, {d: metas[d] for d in runs}, console)
    return runs


def _read_json(path: Path) -> dict[str, Any]:
    """A meta.json as a dict; {} where it is unreadable or not an object (one damaged run must not
    stop `ls` from listing the others)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
