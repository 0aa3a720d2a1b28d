"""ResultSet keeps every measured row on disk as it arrives, then writes a Markdown table."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from gpufeed.bench.results import Column, ResultSet


def test_each_row_is_on_disk_before_the_next_one_is_measured(tmp_path: Path) -> None:
    res = ResultSet(tmp_path / "out", "demo", {"steps": 3}, {"cpu_model": "x"})
    res.add({"a": 1, "b": 2.5})
    doc = json.loads(res.json_path.read_text())
    assert doc["complete"] is False and doc["rows"] == [{"a": 1, "b": 2.5}]
    res.add({"a": 2, "c": "late column"})
    with open(res.csv_path) as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"a": "1", "b": "2.5", "c": ""}, {"a": "2", "b": "", "c": "late column"}]


def test_complete_is_kept_until_changed_and_notes_are_not_repeated(tmp_path: Path) -> None:
    res = ResultSet(tmp_path, "demo", {}, {})
    res.save(complete=True)
    res.note("reduced grid")
    res.note("reduced grid")
    doc = json.loads(res.json_path.read_text())
    assert doc["complete"] is True and doc["finished"] is not None
    assert doc["notes"] == ["reduced grid"]


def test_markdown_formats_values_and_marks_missing_ones(tmp_path: Path) -> None:
    res = ResultSet(tmp_path, "demo", {"batch": 8}, {})
    res.add({"model": "resnet18", "ips": 123.456, "gain": None})
    res.add({"model": "resnet50", "ips": math.nan, "gain": 12.34})
    cols = [
        Column("model", "model"),
        Column("ips", "img/s", "{:.1f}"),
        Column("gain", "gain", "{:+.1f}%"),
    ]
    text = res.write_markdown("Demo", cols, "2-core test CPU").read_text()
    assert text.startswith("# Demo\n\nHardware: 2-core test CPU\n\nParameters: batch=8\n")
    assert "| model | img/s | gain |\n|---|---|---|\n" in text
    assert "| resnet18 | 123.5 | – |" in text and "| resnet50 | – | +12.3% |" in text


def test_a_new_run_in_the_same_folder_leaves_no_earlier_table_or_chart(tmp_path: Path) -> None:
    # a rerun stopped after its first row left the earlier run's complete-looking results.md,
    # results.png and summary.csv beside its own partial rows
    for name in ("results.md", "results.png", "summary.csv", "notes.txt"):
        (tmp_path / name).write_text("earlier run")
    ResultSet(tmp_path, "demo", {}, {}).add({"a": 1})
    left = {p.name for p in tmp_path.iterdir()}
    assert not left & {"results.md", "results.png", "summary.csv"} and "notes.txt" in left
