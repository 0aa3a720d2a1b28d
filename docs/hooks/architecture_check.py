"""Keep the architecture page true: every module and package of src/gpufeed must be named on it,
in a code span (`plan`, `data/plan.py`); the rule modules are on the rules page instead. A module
that is not named is a warning, which fails `mkdocs build --strict`, so that a new module comes
with its line on the map."""

from __future__ import annotations

import re

from errors_page import gpufeed_dir

PAGE = "architecture.md"
SPAN = re.compile(r"`([^`\n]+)`")
# folders whose modules the page need not name one by one: one module per rule, on the rules page
EXEMPT = ("analysis/rules/",)


def unnamed_modules(markdown: str) -> list[str]:
    """The modules and packages of gpufeed (as paths below src/gpufeed) the page does not name."""
    named = {word for span in SPAN.findall(markdown) for word in re.findall(r"\w+", span)}
    package = gpufeed_dir()
    missing = []
    for path in sorted(package.rglob("*")):
        if path.name.startswith("__") or "__pycache__" in path.parts:
            continue
        module = (path.is_file() and path.suffix == ".py") or any(path.glob("*.py"))
        rel = path.relative_to(package).as_posix()
        if module and path.stem not in named and not rel.startswith(EXEMPT):
            missing.append(rel)
    return missing
