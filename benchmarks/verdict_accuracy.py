"""Predictions checked against the fix: does each finding's `est_speedup` come true?

For each scenario (`verdict_loop.py` shaped by options: slow storage with too few loader workers,
CPU-heavy loading on the training thread, a checkpoint every N steps, ...), on this machine:
1. before: the loop under `gpufeed profile --headspace 20`, analyzed; the scenario's finding
   gives its predicted speedup (`est_speedup`) and its recommendation;
2. after: the recommendation applied as written (`num_workers` set to the finding's
   `recommended_num_workers`; a periodic stall removed, as doing it asynchronously would), the
   loop profiled again (same profiler cost, no headspace);
3. measured speedup = after ÷ before, each the loop's own samples/s over its steps after warm-up
   (timed inside the loop, replayed steps left out).
Prints predicted vs measured per scenario and how many are within ±20%; `--out` writes a Markdown
table with the hardware. `--hog` runs it all beside a process keeping one core busy.

Run: python benchmarks/verdict_accuracy.py [--repeats 1] [--hog] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gpufeed
from gpufeed.atomic import write_atomic
from gpufeed.hardware import describe, hardware

LOOP = Path(__file__).resolve().with_name("verdict_loop.py")
TOLERANCE = 0.2


@dataclass(frozen=True)
class Scenario:
    """A loop (`verdict_loop.py` options) and the rule whose advice is applied to it."""

    name: str
    options: dict[str, float]
    rule: str


SCENARIOS = (
    Scenario("storage, no workers", {"read-ms": 2, "workers": 0}, "DataLoaderBottleneck"),
    Scenario("storage, 1 worker", {"read-ms": 2, "workers": 1}, "DataLoaderBottleneck"),
    Scenario("storage, 2 workers", {"read-ms": 2, "workers": 2}, "DataLoaderBottleneck"),
    Scenario("storage, 4 workers", {"read-ms": 4, "workers": 4}, "DataLoaderBottleneck"),
    Scenario(
        "storage, no workers, heavy step",
        {"read-ms": 1, "workers": 0, "compute-ms": 30},
        "DataLoaderBottleneck",
    ),
    Scenario("CPU transform, no workers", {"cpu-ms": 1, "workers": 0}, "DataLoaderBottleneck"),
    Scenario(
        "storage + CPU, no workers",
        {"read-ms": 1, "cpu-ms": 0.5, "workers": 0},
        "DataLoaderBottleneck",
    ),
    Scenario(
        "checkpoint every 10 steps",
        {"read-ms": 0.1, "workers": 1, "stall-every": 10, "stall-ms": 300},
        "PeriodicStall",
    ),
    Scenario(
        "logging every 5 steps",
        {"read-ms": 0.1, "workers": 1, "stall-every": 5, "stall-ms": 60},
        "PeriodicStall",
    ),
)


@dataclass
class Row:
    scenario: str
    rule: str
    change: str
    predicted: float
    measured: float
    before: float
    after: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def _loop(options: dict[str, float], out: Path, run_dir: Path, headspace: int) -> dict:
    """The loop under `gpufeed profile` (into `run_dir`); returns its own JSON figures."""
    argv = [f"--{k}={v:g}" for k, v in options.items()]
    cmd = [sys.executable, "-m", "gpufeed.cli", "profile", "--out", str(run_dir)]
    cmd += ["--headspace", str(headspace), "--", sys.executable, str(LOOP), *argv]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def _apply(finding: gpufeed.analysis.finding.Finding, options: dict) -> tuple[dict, str] | None:
    """The loop's options with the finding's recommendation applied, and the change said."""
    if "recommended_num_workers" in finding.evidence:
        n = int(finding.evidence["recommended_num_workers"])
        return {**options, "workers": n}, f"num_workers {options.get('workers', 0):g} → {n}"
    if finding.rule == "PeriodicStall":
        return {**options, "stall-every": 0}, "stall removed"
    return None


def measure(scenario: Scenario, tmp: Path) -> Row | str:
    """One scenario before and after its advice; a string saying why where it cannot be."""
    before_dir, after_dir = tmp / "before", tmp / "after"
    before = _loop(scenario.options, tmp / "before.json", before_dir, headspace=20)
    (run_dir,) = before_dir.iterdir()
    found = {f.rule: f for f in gpufeed.analyze(gpufeed.load(run_dir))}
    if scenario.rule not in found:
        return f"{scenario.rule} not found (found: {', '.join(found) or 'nothing'})"
    finding = found[scenario.rule]
    applied = _apply(finding, scenario.options)
    if applied is None:
        return f"{scenario.rule} recommends no change of a size: {finding.recommendation[:80]}"
    options, change = applied
    after = _loop(options, tmp / "after.json", after_dir, headspace=0)
    return Row(
        scenario.name,
        scenario.rule,
        change,
        finding.est_speedup or 1.0,
        after["samples_per_s"] / before["samples_per_s"],
        before["samples_per_s"],
        after["samples_per_s"],
    )


@contextmanager
def _hog(on: bool) -> Iterator[None]:
    """A process keeping one core busy, while the block runs (when `on`)."""
    if not on:
        yield
        return
    spin = "import sys\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def table(rows: list[Row], misses: dict[str, str]) -> str:
    """The Markdown table of predicted vs measured speedups, and the count within tolerance."""
    lines = [
        "| scenario | finding | change applied | before img/s | after img/s | predicted | "
        "measured | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.rule} | {r.change} | {r.before:.0f} | {r.after:.0f} | "
            f"×{r.predicted:.2f} | ×{r.measured:.2f} | {100 * r.error:+.0f}% |"
        )
    for name, why in misses.items():
        lines.append(f"| {name} | – | – | – | – | – | – | {why} |")
    within = sum(abs(r.error) <= TOLERANCE for r in rows)
    total = len(rows) + len(misses)
    lines.append("")
    lines.append(f"Within ±{100 * TOLERANCE:.0f}%: {within} of {total} scenarios.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1, help="runs per scenario (medians kept)")
    ap.add_argument("--hog", action="store_true", help="beside a process keeping a core busy")
    ap.add_argument("--only", help="run only scenarios whose name contains this")
    ap.add_argument("--out", type=Path, help="write the Markdown results here")
    o = ap.parse_args()
    rows, misses = [], {}
    chosen = [s for s in SCENARIOS if not o.only or o.only in s.name]
    with _hog(o.hog), tempfile.TemporaryDirectory() as tmp:
        for s in chosen:
            tries: list[Row] = []
            for i in range(o.repeats):
                got = measure(s, Path(tmp) / f"{len(rows)}-{i}")
                if isinstance(got, str):
                    misses[s.name] = got
                    break
                tries.append(got)
            if tries:
                rows.append(_median_row(tries))
                r = rows[-1]
                print(
                    f"{s.name:34s} {r.change:22s} predicted ×{r.predicted:.2f} "
                    f"measured ×{r.measured:.2f} ({100 * r.error:+.0f}%)",
                    flush=True,
                )
            else:
                print(f"{s.name:34s} {misses[s.name]}", flush=True)
    text = table(rows, misses)
    print(text)
    if o.out:
        info = hardware()
        head = (
            "# Predicted vs measured speedups (`benchmarks/verdict_accuracy.py`)\n\n"
            f"Hardware: {describe(info)}. {'Beside a one-core CPU hog. ' if o.hog else ''}"
            f"{o.repeats} run(s) per scenario, medians. Each finding's `est_speedup` (predicted) "
            "against the loop's samples/s after its recommendation was applied ÷ before "
            "(measured).\n\n"
        )
        write_atomic(o.out, head + text + "\n", make_parents=True)


def _median_row(tries: list[Row]) -> Row:
    """The run with the median measured speedup (the lower one of an even count)."""
    ordered = sorted(tries, key=lambda r: r.measured)
    return ordered[(len(ordered) - 1) // 2]


if __name__ == "__main__":
    main()
