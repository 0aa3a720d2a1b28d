"""The layers of the package (docs/architecture.md): a module imports only the ground floor,
its own package and the layers below its own, never one beside or above it. Read from the
source itself (every `from gpufeed.X import`/`import gpufeed.X`, at the top or inside a
function), so a new import that runs back up a layer fails here, not in a reader's head."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import gpufeed

PACKAGE = Path(gpufeed.__file__).parent

# each part of the package and its floor: a module may import parts of a lower floor (the ground
# floor's modules, floor 0, also one another)
FLOORS = {
    **dict.fromkeys(
        (
            "errors",
            "text",
            "progress",
            "atomic",
            "devices",
            "cores",
            "extras",
            "processes",
            "output_paths",
        ),
        0,
    ),
    **dict.fromkeys(("profiler", "data", "train"), 1),
    **dict.fromkeys(("analysis", "hardware"), 2),
    **dict.fromkeys(("advise", "present"), 3),
    "commands": 4,
    **dict.fromkeys(("demo", "integrations"), 5),
    "bench": 6,  # experiments on the demo's data
    "cli": 7,
    **dict.fromkeys(("__init__", "__main__"), 8),
}


def _part(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def _imported_parts(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        found |= {n.split(".")[1] for n in names if n.startswith("gpufeed.")}
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "bootstrap" not in p.parts)


def test_every_part_of_the_package_has_a_floor():
    assert {_part(p) for p in MODULES} <= set(FLOORS), "add the new part to FLOORS and the docs"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_part_and_lower_floors(path: Path):
    mine = _part(path)
    wrong = {
        part
        for part in _imported_parts(path) - {mine}
        if part in FLOORS and (FLOORS[part], FLOORS[mine]) >= (FLOORS[mine], 1)
    }
    assert not wrong, f"{path.relative_to(PACKAGE)} ({mine}) imports {sorted(wrong)}"


def test_the_check_sees_an_import_that_runs_up_a_layer(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gpufeed.present.numbers import count\n")
    assert _imported_parts(module) == {"present"}


# --- the feed's rooms ------------------------------------------------------------------------------

ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"
FEED = sorted(p for p in (PACKAGE / "data").glob("*.py") if p.stem != "__init__")


def _rooms() -> dict[str, int]:
    """Each module of `data/` and the row of its room in the architecture page's table."""
    page = ARCHITECTURE.read_text()
    table = page[page.index("### The feed: `data/`") : page.index("## Where to add")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    room: dict[str, int] = {}
    for i, row in enumerate(rows):
        for name in re.findall(r"`([a-z_]+)`", row.rsplit(" | ", 1)[-1]):
            if (PACKAGE / "data" / f"{name}.py").is_file():
                room.setdefault(name, i)
    return room


def test_every_module_of_the_feed_has_a_room_on_the_architecture_page():
    room = _rooms()
    modules = {p.stem for p in (PACKAGE / "data").glob("*.py")} - {"__init__"}
    assert modules <= set(room), f"name {sorted(modules - set(room))} in a room of the page"


@pytest.mark.parametrize("path", FEED, ids=lambda p: p.stem)
def test_a_room_of_the_feed_imports_only_the_rooms_above_it(path: Path):
    room = _rooms()
    if path.stem not in room:
        pytest.skip("not in a room (the test above names it)")
    below = {m for m in _imported_data_modules(path) if m in room and room[m] > room[path.stem]}
    assert not below, f"data/{path.name} imports {sorted(below)}, from a room below its own"


def _imported_data_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpufeed.data."):
            found.add(node.module.split(".")[2])
    return found
