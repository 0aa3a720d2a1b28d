"""`gpufeed show` / `gpufeed ls` print what came from a run as plain text: Rich markup in argv or
names is neither interpreted nor fatal, control sequences never reach the terminal, and secrets
that an older meta.json still holds are redacted on screen."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpufeed.commands.ls import list_runs
from gpufeed.commands.show import show
from gpufeed.present.terminal import print_findings

HOSTILE = ["[/x]", "[link=http://evil.example]y[/link]", "\x1b[31mred\x1b[0m", "[bold]b[/bold]"]


def _plain(fn, *args) -> str:
    console = Console(record=True, width=400)
    fn(*args, console=console)
    return console.export_text()


def _raw(fn, *args) -> str:
    """What a real colour terminal would receive."""
    buf = io.StringIO()
    fn(*args, console=Console(file=buf, width=400, force_terminal=True, color_system="truecolor"))
    return buf.getvalue()


@pytest.fixture
def hostile_run(make_run):
    run_dir = make_run(
        meta={
            "command": ["python", "train.py", *HOSTILE, ":smile:"],
            "hosts": ["[red]h1"],
            "cpu_model": "[/]\x1b]0;title\x07",
            "gpus": [{"index": 0, "name": "[link=http://x]H100[/link]"}],
            "gpu_unavailable": "[/dim] \x9b31m",
        },
        system=[(1000.0, "cpu.util", "[/x]", 5.0), (1000.0, "[link=http://x]m[/link]", "", 1.0)],
    )
    renamed = run_dir.with_name("run-[bold]x[link=http:x]y\x1b[31m")
    run_dir.rename(renamed)
    return renamed


def test_show_prints_hostile_run_strings_as_plain_text(hostile_run):
    out = _plain(show, hostile_run)  # raised MarkupError before
    for text in ("[/x]", "[link=http://evil.example]y[/link]", "[bold]b[/bold]", ":smile:"):
        assert text in out
    assert "\\x1b[31mred\\x1b[0m" in out  # the escape is shown, not sent
    assert "[red]h1" in out and "[/]\\x1b]0;title\\x07" in out and "[/dim] \\x9b31m" in out
    assert "[link=http://x]H100[/link]" in out
    assert "[link=http://x]m[/link]" in out
    assert "run-[bold]x[link=http:x]y\\x1b[31m" in out
    raw = _raw(show, hostile_run)
    assert "\x1b]8;" not in raw  # no live hyperlink (OSC 8)
    assert "\x1b]0;" not in raw and "\x07" not in raw and "\x9b" not in raw
    assert "\x1b[31mred" not in raw


def test_ls_survives_a_hostile_run_and_lists_every_run(make_run, hostile_run, tmp_path):
    ordinary = make_run()
    out = _plain(list_runs, tmp_path)  # raised MarkupError for the whole folder before
    assert ordinary.name in out
    assert "run-[bold]x[link=http:x]y\\x1b[31m" in out
    assert "[/x] [link=http://evil" in out
    raw = _raw(list_runs, tmp_path)
    assert "\x1b]8;" not in raw and "\x1b[31mred" not in raw and "\x1b[31m\n" not in raw


def test_show_and_ls_redact_secrets_left_in_an_old_meta_json(make_run, tmp_path):
    run_dir = make_run(
        meta={"command": ["python", "t.py", "--pwd", "Pw9x", "https://u:p@ss@h/x", "-p", "Pw9x"]}
    )
    for out in (_plain(show, run_dir), _plain(list_runs, tmp_path)):
        assert "Pw9x" not in out and "p@ss" not in out and "ss@h" not in out
    assert "--pwd *** https://u:***@h/x -p ***" in _plain(show, run_dir)


def test_findings_with_run_strings_print_as_text():
    finding = {
        "severity": "warning",
        "title": "Host [/x] is slow \x1b[2J",
        "evidence": {"host": "[link=http://x]h[/link]"},
        "recommendation": "see [bold]x\x1b[31m",
        "est_speedup": 1.5,
    }
    out = _plain(print_findings, [finding])
    assert "Host [/x] is slow \\x1b[2J" in out
    assert "host=[link=http://x]h[/link]" in out and "see [bold]x\\x1b[31m" in out
    raw = _raw(print_findings, [finding])
    assert "\x1b[2J" not in raw and "\x1b]8;" not in raw


def test_ls_lists_the_other_runs_when_a_meta_json_is_damaged(make_run, tmp_path):
    good = make_run()
    for i, text in enumerate(["[]", '{"start_time": "x", "end_time": 1e300, "command": "a b"}']):
        bad = make_run()
        (bad / "meta.json").write_text(text)
        bad.rename(tmp_path / f"damaged{i}")
    out = _plain(list_runs, tmp_path)
    assert good.name in out and "damaged0" in out and "damaged1" in out
    assert "damaged meta.json" in out.split("damaged0")[1].splitlines()[0]


def test_ls_lists_a_run_whose_meta_json_is_missing(make_run, tmp_path):
    good, lost = make_run(), make_run()
    (lost / "meta.json").unlink()  # e.g. killed before it was written: its store files remain
    runs = list_runs(tmp_path, console=Console(record=True, width=200))
    assert set(runs) == {good, lost}
    row = next(line for line in _plain(list_runs, tmp_path).splitlines() if lost.name in line)
    assert "no meta.json" in row
    (lost / "meta.json").mkdir()  # there but not readable as a file (also as root)
    row = next(line for line in _plain(list_runs, tmp_path).splitlines() if lost.name in line)
    assert "unreadable meta.json" in row
