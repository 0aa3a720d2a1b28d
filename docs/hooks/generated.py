"""mkdocs hook: page sections that come from the code at build time, so they cannot drift from it.

A page holds a marker line ``<!-- gpufeed:NAME -->``, which is replaced by what NAME's module makes:
``rules`` (the rule registry, as `gpufeed rules` lists it: rules_page), ``frames`` (the run frames'
schema: frames_page), ``cli`` (every command's help from the typer app: cli_page), ``errors``
(every GpufeedError subclass in the source: errors_page) and ``imports`` (which package imports
which: imports_page). A marker with no maker fails the build, as does a maker that raises.
The architecture page is also checked to name every module (architecture_check).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from architecture_check import PAGE, unnamed_modules
from cli_page import cli_markdown
from errors_page import errors_markdown
from frames_page import frames_markdown
from imports_page import imports_markdown
from rules_page import rules_markdown

MAKERS: dict[str, Callable[[], str]] = {
    "rules": rules_markdown,
    "frames": frames_markdown,
    "cli": cli_markdown,
    "errors": errors_markdown,
    "imports": imports_markdown,
}
MARKER = re.compile(r"^<!-- gpufeed:([a-z]+) -->$", re.MULTILINE)
log = logging.getLogger("mkdocs.hooks.generated")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace each marker of the page with the Markdown its maker returns."""

    def made(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in MAKERS:
            raise ValueError(f"{page.file.src_uri}: no maker for <!-- gpufeed:{name} -->")
        return MAKERS[name]()

    if page.file.src_uri == PAGE:
        for module in unnamed_modules(markdown):
            log.warning("%s does not name src/gpufeed/%s: add it to the map", PAGE, module)
    return MARKER.sub(made, markdown)
