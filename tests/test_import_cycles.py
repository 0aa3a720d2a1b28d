"""No import circles between the modules of the package: read from the source itself (every
`import gpufeed.X`, `from gpufeed.X import` and relative import, at the top or inside a function;
only those under `if TYPE_CHECKING:` are left out, as they never run), so a circle dodged by an
import inside a function fails here too. A circle makes the order of imports matter and keeps
modules from being read (or moved) one at a time.

An edge goes to the module named, not to the packages above it: `from gpufeed.a.b import c` is an
edge to `gpufeed.a.b` (or to `gpufeed.a.b.c` where that is a module), although Python runs
`gpufeed/a/__init__.py` first as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpufeed

PACKAGE = Path(gpufeed.__file__).parent

# Edges of circles known and not broken yet, outside analysis/: each must still exist (so that the
# list shrinks as they are broken), and no other circle may form.
# issue 37: to break
ALLOWED: set[tuple[str, str]] = set()


def module_names(root: Path) -> dict[str, Path]:
    """Every module under the package directory `root`, by its dotted name."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that can run: all but those in the body of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)
    return found


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name`, or the longest dotted prefix of it that is a module of the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that the module `name` (at `path`) imports where it may run."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        out |= {m for t in targets if (m := _known(t, modules)) is not None}
    out.discard(name)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see `imported_modules`)."""
    modules = module_names(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (as a path that returns to its start) in each group of modules that import one
    another (strongly connected components, Tarjan's algorithm); empty when there is none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, group) for group in groups]


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest circle through the first module (by name) of a strongly connected `group`."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def _without(graph: dict[str, set[str]], edges: set[tuple[str, str]]) -> dict[str, set[str]]:
    return {v: {w for w in ws if (v, w) not in edges} for v, ws in graph.items()}


def test_the_package_has_no_import_circle():
    graph = import_graph(PACKAGE)
    found = cycles(_without(graph, ALLOWED))
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_allowed_edge_still_exists():
    graph = import_graph(PACKAGE)
    gone = sorted((a, b) for a, b in ALLOWED if b not in graph.get(a, set()))
    assert not gone, f"no longer imported: remove from ALLOWED: {gone}"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    for path in (root / "__init__.py", root / "sub" / "__init__.py"):
        path.write_text("")
    return root


def test_the_check_sees_a_circle_dodged_inside_a_function(package: Path):
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


def test_the_check_leaves_out_imports_for_type_checking_only(package: Path):
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\nelse:\n    pass\n"
    )
    assert import_graph(package)["pkg.sub.b"] == set()
    assert cycles(import_graph(package)) == []
