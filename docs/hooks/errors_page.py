"""The table of every error class: each class in src/gpufeed deriving from `GpufeedError`, found
by reading the source (no import: some live in modules of optional extras), with its module, the
built-in errors it also is, and the first line of its docstring."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from markdown_text import cell, table

ROOT = "GpufeedError"


def errors_markdown() -> str:
    """A table of the error classes, ordered by module then name."""
    classes = source_classes()
    found = {ROOT}
    grew = True
    while grew:  # subclasses of subclasses, in any module order
        grew = False
        for name, (_, bases, _) in classes.items():
            if name not in found and found & set(bases):
                found.add(name)
                grew = True
    rows = []
    for name in sorted(found - {ROOT}, key=lambda n: (classes[n][0], n)):
        module, bases, doc = classes[name]
        also = ", ".join(f"`{b}`" for b in bases if b not in found)
        rows.append((f"`{name}`", f"`{module}`", also, cell(doc)))
    return table(("error", "module", "also a", "meaning"), rows) + "\n"


def gpufeed_dir() -> Path:
    """The gpufeed package's folder, found without importing it."""
    spec = importlib.util.find_spec("gpufeed")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("gpufeed not found: is it installed in this environment?")
    return Path(next(iter(spec.submodule_search_locations)))


def source_classes() -> dict[str, tuple[str, list[str], str]]:
    """{class name: (module, base names, first docstring line)} for every class in gpufeed."""
    package = gpufeed_dir()
    classes = {}
    for path in sorted(package.rglob("*.py")):
        module = ".".join(("gpufeed", *path.relative_to(package).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                doc = (ast.get_docstring(node) or "").strip().split("\n\n")[0]
                classes[node.name] = (module.removesuffix(".__init__"), bases, doc)
    return classes
