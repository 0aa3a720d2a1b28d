"""Each command analyzes a run once (`analysis.result.analyze_run`: one rule `Context`) and its
presenters only render: they import nothing that analyzes, and redaction is done when loading."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import gpufeed
import gpufeed.analysis.result as result
import gpufeed.analysis.rules.registry as registry
from gpufeed.analysis.rules.context import Context
from gpufeed.cli import app

runner = CliRunner(env={"COLUMNS": "200"})
STEPS = {0: [(i, 1010.0 + i, 1011.0 + i, 0.8, 8.0, None) for i in range(40)]}  # 80% data wait
SRC = Path(gpufeed.__file__).parent


class CountingContext(Context):
    """A real `Context` that counts how many were built."""

    built = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).built += 1
        super().__init__(*args, **kwargs)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> type[CountingContext]:
    """Every `Context` the analysis builds, counted."""
    CountingContext.built = 0
    monkeypatch.setattr(result, "Context", CountingContext)
    monkeypatch.setattr(registry, "Context", CountingContext)
    return CountingContext


def test_show_builds_one_context(make_run, counted) -> None:
    res = runner.invoke(app, ["show", str(make_run(ranks=STEPS))])
    assert res.exit_code == 0 and "Input pipeline" in res.stdout, res.output
    assert counted.built == 1


def test_report_builds_one_context(make_run, counted, tmp_path) -> None:
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(make_run(ranks=STEPS)), "-o", str(out)])
    assert res.exit_code == 0 and out.is_file(), res.output
    assert counted.built == 1


def _imports(folder: Path) -> dict[str, set[str]]:
    """Each module of `folder` with every `gpufeed` module it imports, at any depth."""
    found: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        found[path.name] = {n for n in names if n.startswith("gpufeed")}
    return found


def test_presenters_neither_run_rules_nor_redact() -> None:
    for module, names in _imports(SRC / "present").items():
        bad = {
            n for n in names if n.startswith(("gpufeed.analysis.rules", "gpufeed.profiler.redact"))
        }
        assert not bad, f"present/{module} imports {bad}"


def test_commands_build_no_context_of_their_own() -> None:
    for module, names in _imports(SRC / "commands").items():
        bad = {n for n in names if n.startswith("gpufeed.analysis.rules")}
        assert not bad, f"commands/{module} imports {bad}"


def test_load_redacts_an_old_meta_json_once(make_run) -> None:
    command = ["python", "t.py", "--password", "Pw9x"]
    run = gpufeed.load(make_run(meta={"command": command}))
    assert run.meta["command"] == ["python", "t.py", "--password", "***"]
