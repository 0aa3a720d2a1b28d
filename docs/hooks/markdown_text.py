"""Plain text from docstrings and help strings made safe to put into Markdown pages and tables."""

from __future__ import annotations


def prose(text: str) -> str:
    """`text` with ``<`` and ``>`` outside code spans escaped (``SRC/<class>`` is not HTML)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside backticks
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def cell(text: str) -> str:
    """`text` as one table cell: on one line, its pipes escaped."""
    return prose(" ".join(text.split())).replace("|", "\\|")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A Markdown table; the cells are given ready (see `cell`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
