"""The import table of the architecture page: which of gpufeed's packages each package imports
from, and through which modules, read from the source (every `import` and `from ... import`,
also those inside functions), so the page says what the code does today."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from errors_page import gpufeed_dir
from markdown_text import table


def imports_markdown() -> str:
    """One row per package: the other parts of gpufeed it imports, each with the modules used."""
    package = gpufeed_dir()
    uses: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        part = part_of(package, rel.parts[0].removesuffix(".py"))
        for target in imported(path):
            names = target.split(".")
            if names[0] != "gpufeed" or len(names) < 2:
                continue
            other = part_of(package, names[1])
            if other != part:
                uses[part][other].add(module_of(package, names[1:]))
    rows = []
    for part in sorted(uses, key=order_key):
        cells = [
            f"`{o}` ({', '.join(sorted(uses[part][o]))})" for o in sorted(uses[part], key=order_key)
        ]
        rows.append((f"`{part}`", "; ".join(cells)))
    return table(("package", "imports from (modules used)"), rows) + "\n"


def part_of(package: Path, name: str) -> str:
    """A subpackage's name, "cli", or "ground floor" for the shared helper modules."""
    if (package / name).is_dir():
        return name
    if name in ("cli", "__main__"):
        return name
    return "__init__" if name.startswith("__") else "ground floor"  # gpufeed.__version__ too


def order_key(part: str) -> tuple[int, str]:
    """Subpackages in the order the layers are read, then the rest by name."""
    layers = ["profiler", "analysis", "present", "commands", "data", "advise", "demo", "train",
              "bench", "integrations", "ground floor", "cli", "__init__", "__main__"]  # fmt: skip
    return (layers.index(part), part) if part in layers else (len(layers), part)


def module_of(package: Path, names: list[str]) -> str:
    """The module a dotted name below gpufeed lies in (`present.numbers` for
    present.numbers.count), down to two levels."""
    found, where = [], package
    for name in names[:2]:
        if (where / name).is_dir() or (where / f"{name}.py").is_file():
            found.append(name)
            where = where / name
        else:
            break
    return ".".join(found) or names[0]


def imported(path: Path) -> list[str]:
    """Every module name `path` imports (a `from X import y` counts as X.y, y maybe a name)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names
