"""An experiment's results on disk: CSV + JSON rewritten after every row, then a Markdown table.

Rewriting after each row means a run that is interrupted or runs out of its time budget still
leaves every measurement it made, marked ``"complete": false``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufeed.atomic import write_atomic


@dataclass(frozen=True)
class Column:
    """One column of the Markdown table: the row key, its header and how to print a value."""

    key: str
    header: str
    fmt: str = "{}"

    def cell(self, row: dict[str, Any]) -> str:
        value = row.get(self.key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        return self.fmt.format(value)


def _csv(rows: Sequence[dict[str, Any]]) -> str:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    if not keys:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


class ResultSet:
    """Rows of one experiment with its parameters and hardware, kept on disk as they arrive."""

    def __init__(
        self, out_dir: Path, experiment: str, params: dict[str, Any], hardware: dict[str, Any]
    ):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.experiment = experiment
        self.params = params
        self.hardware = hardware
        self.rows: list[dict[str, Any]] = []
        self.summary: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.started = time.time()
        self.complete = False
        # an earlier run's table, chart and summary would stand, complete-looking, beside this
        # run's rows until it writes its own (and for good where it is stopped first)
        for stale in ("results.md", "results.png", "summary.csv"):
            (self.out_dir / stale).unlink(missing_ok=True)

    @property
    def csv_path(self) -> Path:
        return self.out_dir / "results.csv"

    @property
    def json_path(self) -> Path:
        return self.out_dir / "results.json"

    @property
    def md_path(self) -> Path:
        return self.out_dir / "results.md"

    def add(self, row: dict[str, Any]) -> None:
        """Append a row and rewrite the CSV and JSON files."""
        self.rows.append(row)
        self.save()

    def set_summary(self, rows: list[dict[str, Any]]) -> None:
        """Replace the derived table (e.g. medians over repeats) and rewrite the files."""
        self.summary = rows
        self.save()

    def note(self, text: str) -> None:
        """A sentence for the reader (what was reduced, what was skipped and why)."""
        if text not in self.notes:
            self.notes.append(text)
            self.save()

    def save(self, complete: bool | None = None) -> None:
        """Rewrite results.csv and results.json from the rows so far; ``complete`` marks (or, as
        None, keeps) whether every planned configuration ran."""
        if complete is not None:
            self.complete = complete
        write_atomic(self.csv_path, _csv(self.rows))
        if self.summary:
            write_atomic(self.out_dir / "summary.csv", _csv(self.summary))
        doc = {
            "experiment": self.experiment,
            "complete": self.complete,
            "started": self.started,
            "finished": time.time() if self.complete else None,
            "params": self.params,
            "hardware": self.hardware,
            "notes": self.notes,
            "rows": self.rows,
            "summary": self.summary,
        }
        write_atomic(self.json_path, json.dumps(doc, indent=2, default=str) + "\n")

    def write_markdown(
        self,
        title: str,
        columns: Sequence[Column],
        hardware_line: str,
        rows: Sequence[dict[str, Any]] | None = None,
        extra: Callable[[], str] | None = None,
    ) -> Path:
        """Write results.md: title, hardware, parameters, notes and the table."""
        rows = self.rows if rows is None else rows
        out = [f"# {title}", "", f"Hardware: {hardware_line}", ""]
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        out += [f"Parameters: {params}", ""]
        out += [f"- {n}" for n in self.notes] + ([""] if self.notes else [])
        out.append("| " + " | ".join(c.header for c in columns) + " |")
        out.append("|" + "|".join("---" for _ in columns) + "|")
        out += ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows]
        if extra is not None:
            out += ["", extra()]
        write_atomic(self.md_path, "\n".join(out) + "\n")
        return self.md_path
