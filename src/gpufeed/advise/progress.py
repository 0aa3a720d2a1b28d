"""What `diagnose` and `tune` say while they measure: one dim line per step on stderr, or nothing.

Their results are returned, never printed: the command line prints what they return."""

from __future__ import annotations

from collections.abc import Callable


def progress_notes(progress: bool = True) -> Callable[[str], None]:
    """A `note(text)` that prints `text` dim on stderr when `progress`, else does nothing."""
    if not progress:
        return lambda text: None
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, highlight=False)
    return lambda text: console.print(f"[dim]  {escape(text)}[/]", emoji=False)
