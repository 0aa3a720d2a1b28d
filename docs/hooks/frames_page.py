"""The frames page: the schema of `gpufeed.load`'s frames (columns, units, meaning).

It comes from `gpufeed.analysis.schema.frames_markdown()`. Until that function exists, the page
shows the schema where the code states it today, the docstring of gpufeed/analysis/run.py (read
from the file, not imported), as preformatted text; the build says which it used.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.frames_page")

SCHEMA_MODULE = "gpufeed.analysis.schema"
RUN_MODULE = "gpufeed.analysis.run"


def frames_markdown() -> str:
    """The schema as Markdown, from the schema module or else from run.py's docstring."""
    if importlib.util.find_spec(SCHEMA_MODULE) is not None:
        module = importlib.import_module(SCHEMA_MODULE)  # an error in it fails the build
        if hasattr(module, "frames_markdown"):
            return module.frames_markdown().strip() + "\n"
    log.info("frames page: no %s.frames_markdown yet: %s's docstring", SCHEMA_MODULE, RUN_MODULE)
    return from_run_docstring()


def from_run_docstring() -> str:
    """run.py's module docstring, which holds the schema today, as a preformatted block."""
    spec = importlib.util.find_spec(RUN_MODULE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{RUN_MODULE} not found: is gpufeed installed in this environment?")
    text = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))
    if not text:
        raise RuntimeError(f"{spec.origin}: no module docstring to take the frames' schema from")
    return (
        f"As the docstring of `{RUN_MODULE}` states it:\n\n"
        "```text\n" + text.replace("``", "`") + "\n```\n"
    )
