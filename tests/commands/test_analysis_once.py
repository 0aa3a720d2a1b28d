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


# What a presenter may take from `analysis` (or the `gpufeed` facade, which holds `analyze`) by
# name beyond constants and types: lookups of how a figure is shown, which compute nothing.
_LOOKUPS = {"gpufeed.analysis.schema": {"unit"}, "gpufeed": {"__version__"}}


def test_presenters_import_no_computing_function_from_analysis() -> None:
    """The presenters render what `analyze_run` (or `timeline`, `step_scalars`) computed: from
    `gpufeed.analysis` they import constants (`PHASES`, `PERCENTILES`, `UNITS`) and types only,
    never a function that computes (`step_phases`, `time_bins`, `role_totals`, ...)."""
    for path in (SRC / "present").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = {a.name for a in node.names if a.name.startswith("gpufeed.analysis")}
                assert not modules, f"present/{path.name} imports the module(s) {modules}"
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            if node.module == "gpufeed" or node.module.startswith("gpufeed.analysis"):
                allowed = _LOOKUPS.get(node.module, set())
                bad = {
                    a.name
                    for a in node.names
                    if not (a.name.isupper() or a.name[:1].isupper() or a.name in allowed)
                }
                assert not bad, f"present/{path.name} imports {bad} from {node.module}"


def test_trace_and_export_render_a_timeline_without_running_the_rules(
    make_run, counted, tmp_path
) -> None:
    run_dir = make_run(ranks=STEPS, system=[(1000.0 + i, "cpu.util", "", 10.0) for i in range(5)])
    res = runner.invoke(app, ["trace", str(run_dir), "-o", str(tmp_path / "t.json")])
    assert res.exit_code == 0 and (tmp_path / "t.json").is_file(), res.output
    res = runner.invoke(app, ["export", str(run_dir), "--tensorboard", str(tmp_path / "tb")])
    assert res.exit_code == 0, res.output
    assert counted.built == 0
