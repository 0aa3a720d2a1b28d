"""Totals of the bad-input sweep: how many bad inputs were tried, how many got one clear error
line with the right exit code and nothing written, and how many showed a traceback.

Runs `tests/test_bad_inputs.py` (the real command line, one subprocess per bad input) with
GPUFEED_SWEEP_LOG set, then counts its log per command. Nothing here is hard-coded: the figures
README's "Reliability" section quotes are what this prints.
Run: python benchmarks/bad_input_sweep.py [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sweep() -> list[dict]:
    """One row per bad input: command, case, code, clear, traceback."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sweep.jsonl"
        env = {**os.environ, "GPUFEED_SWEEP_LOG": str(log)}
        test = str(ROOT / "tests" / "test_bad_inputs.py")
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            env=env,
            cwd=ROOT,
        )
        return [json.loads(line) for line in log.read_text().splitlines()]


def table(rows: list[dict]) -> str:
    """A markdown table of tried / clear / tracebacks per command and in all."""
    tried, clear, tracebacks = Counter(), Counter(), Counter()
    for r in rows:
        tried[r["command"]] += 1
        clear[r["command"]] += r["clear"]
        tracebacks[r["command"]] += r["traceback"]
    lines = ["| command | tried | clear | tracebacks |", "|---|---|---|---|"]
    for cmd in sorted(tried):
        lines.append(f"| {cmd} | {tried[cmd]} | {clear[cmd]} | {tracebacks[cmd]} |")
    total = (sum(tried.values()), sum(clear.values()), sum(tracebacks.values()))
    lines.append("| **all** | **{}** | **{}** | **{}** |".format(*total))
    unclear = [f"{r['command']}: {r['case']}" for r in rows if not r["clear"]]
    if unclear:
        lines.append("\nNot clear: " + "; ".join(unclear))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    text = table(sweep())
    hw = f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}"
    print(text + f"\n\nHardware: {hw}")
    if args.out:
        Path(args.out).write_text(f"# bad-input sweep\n\n{text}\n\nHardware: {hw}\n")


if __name__ == "__main__":
    main()
