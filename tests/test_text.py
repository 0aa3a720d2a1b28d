"""`gpufeed.text.visible`, the one escaping helper for text from data: what it escapes, what it
keeps, and that the older names (`present.terminal.visible`, `data.packing.printable`) are it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpufeed import text
from gpufeed.data.packing import printable
from gpufeed.present import terminal
from gpufeed.text import valid_text, visible


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # ESC: clear the screen
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),  # OSC: set the title, BEL
        ("\x1b]8;;http://x\x1b\\", "\\x1b]8;;http://x\\x1b\\"),  # OSC 8: a hyperlink
        ("a\rb\tc\x00", "a\\rb\\tc\\x00"),  # other C0 controls
        ("\x7f", "\\x7f"),  # DEL
        ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1: CSI, NEL
        ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
        ("\u2066x\u2069", "\\u2066x\\u2069"),  # bidi isolates
        ("\u061c\u200e\u200f", "\\u061c\\u200e\\u200f"),  # bidi marks
        ("a\u200bb\u200dc\ufeff", "a\\u200bb\\u200dc\\ufeff"),  # zero-width space, joiner, BOM
        ("soft\xadhyphen", "soft\\xadhyphen"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("tag\U000e0041\U000e007f", "tag\\U000e0041\\U000e007f"),  # invisible tag characters
        ("caf\udce9.jpg", "caf\\xe9.jpg"),  # a Latin-1 file name's byte (surrogateescape)
        ("\ud800", "\\ud800"),  # a lone surrogate no byte makes
    ],
)
def test_visible_escapes_controls_bidi_and_invisible_characters(raw: str, shown: str) -> None:
    assert visible(raw) == shown
    assert visible(shown) == shown  # escaping twice changes nothing
    assert shown.isascii() and shown.isprintable()


@pytest.mark.parametrize(
    "text",
    [
        "plain ASCII",
        "naïve café",
        "日本語のファイル名",
        "emoji 🙂 ok",
        "[bold]x[/bold]",
        "a\\x1b",
        "",
    ],
)
def test_visible_keeps_printable_text_as_it_is(text: str) -> None:
    assert visible(text) == text


def test_visible_takes_any_value_and_keeps_newlines_when_asked() -> None:
    assert visible(42) == "42"
    assert visible("a\nb\x1b") == "a\\nb\\x1b"
    assert visible("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


def test_valid_text_writes_undecodable_bytes_and_keeps_the_rest() -> None:
    assert valid_text("caf\udce9\x1b") == "caf\\xe9\x1b"  # stored as given, escaped when shown
    assert valid_text("日本") == "日本"
    valid_text("\ud800").encode("utf-8")  # always encodable


def test_the_older_names_are_the_one_helper() -> None:
    assert terminal.visible is visible
    assert printable("caf\udce9\x1b]0;t\x07") == "caf\\xe9\\x1b]0;t\\x07"


def test_text_is_ground_floor_it_imports_no_other_gpufeed_module() -> None:
    tree = ast.parse(Path(text.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert [m for m in imported if m and m.startswith("gpufeed")] == []
