"""The augload grid's results made readable: medians per (model, load) of each preprocessing path,
its trend set against the published one, and the Markdown table and plot (`gpufeed bench augload`).
The grid itself (its loads, models and paths) is `experiments`'; it passes them in."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any

from gpufeed.bench.results import Column, ResultSet


def augload_summary(
    rows: list[dict[str, Any]],
    models: Sequence[str],
    n_images: int,
    loads: Sequence[int],
    modes: Sequence[str],
) -> list[dict[str, Any]]:
    """One row per (model, load): median images/s of each path, seconds per epoch, the gain of
    the gpu path over cpu workers and input-pipeline efficiency (÷ synthetic-data images/s)."""
    ips: dict[tuple[str, str, int | None], list[float]] = {}
    for r in rows:
        if r["images_per_s"]:
            ips.setdefault((r["model"], r["preprocess"], r["load"]), []).append(r["images_per_s"])
    out = []
    for model in models:
        synth = ips.get((model, "synthetic", None))
        ceiling = statistics.median(synth) if synth else None
        for load in loads:
            row: dict[str, Any] = {"model": model, "load": load, "synthetic_ips": ceiling}
            for mode in modes:
                got = ips.get((model, mode, load))
                med = statistics.median(got) if got else None
                row[f"{mode}_ips"] = med
                row[f"{mode}_ips_range"] = f"{min(got):.1f}-{max(got):.1f}" if got else None
                row[f"{mode}_ips_spread_pct"] = (
                    round(100.0 * (max(got) - min(got)) / med, 1) if got and med else None
                )
                row[f"{mode}_epoch_s"] = round(n_images / med, 3) if med else None
                row[f"{mode}_efficiency"] = round(med / ceiling, 3) if med and ceiling else None
                row["repeats"] = max(row.get("repeats", 0), len(got or ()))
            cpu, gpu = row["cpu_ips"], row["gpu_ips"]  # the medians, not the rounded seconds
            row["gpu_gain_pct"] = round(100.0 * (1 - cpu / gpu), 1) if cpu and gpu else None
            if row["repeats"]:
                out.append(row)
    return out


def augload_trend(
    summary: list[dict[str, Any]], models: Sequence[str], loads: Sequence[int], modes: Sequence[str]
) -> list[str]:
    """Sentences comparing the measured trend with the published one."""
    gain = {
        (r["model"], r["load"]): r["gpu_gain_pct"] for r in summary if r["gpu_gain_pct"] is not None
    }
    out = []
    for model in models:
        g = [(load, gain[(model, load)]) for load in loads if (model, load) in gain]
        if len(g) < 2:
            continue
        xs, ys = [x for x, _ in g], [y for _, y in g]
        change = statistics.linear_regression(xs, ys).slope * (xs[-1] - xs[0])
        spread = max(
            (r[f"{mode}_ips_spread_pct"] or 0.0)
            for r in summary
            if r["model"] == model
            for mode in modes
        )
        single = max(r["repeats"] for r in summary if r["model"] == model) < 2
        trend = "grows" if change > 0 else "shrinks"
        verdict = (
            f"{trend} by {abs(change):.1f} points over the loads (least-squares fit"
            + ("; one run per point, so the noise is unknown)" if single else ")")
            if abs(change) > spread
            else f"shows no trend beyond the noise ({change:+.1f} points fitted, repeats spread "
            f"up to {spread:.0f}%)"
        )
        out.append(
            f"{model}: the gain of the gpu path over cpu workers {verdict}: "
            + ", ".join(f"{y:+.1f}% at L={x}" for x, y in g)
            + " (published: grows with the load)."
        )
    top = max(loads)
    at_top = [(m, gain[(m, top)]) for m in models if (m, top) in gain]
    if len(at_top) >= 2:
        shrinking = all(a[1] >= b[1] for a, b in itertools.pairwise(at_top))
        out.append(
            f"At L={top} the gain {'shrinks' if shrinking else 'does not shrink steadily'} as the "
            "model grows ("
            + ", ".join(f"{m} {v:+.1f}%" for m, v in at_top)
            + "; published: shrinks)."
        )
    eff = {(r["model"], r["load"]): r["gpu_efficiency"] for r in summary}
    e = eff.get(("resnet50", top))
    if e is not None:
        out.append(
            f"ResNet-50 input-pipeline efficiency with the gpu path at L={top}: {e:.2f} "
            f"(target ≥ 0.9: {'met' if e >= 0.9 else 'NOT met'})."
        )
    return out


def write_augload_report(
    res: ResultSet,
    models: Sequence[str],
    n_images: int,
    loads: Sequence[int],
    modes: Sequence[str],
    hardware_line: str,
) -> None:
    """Write the summary's notes, Markdown table and seconds-per-epoch plot into `res`."""
    from gpufeed.bench.plots import line_panels

    summary = res.summary
    columns = [
        Column("model", "model"),
        Column("load", "load L"),
        Column("cpu_epoch_s", "cpu s/epoch", "{:.2f}"),
        Column("gpu_epoch_s", "gpu s/epoch", "{:.2f}"),
        Column("gpu_gain_pct", "gpu gain", "{:+.1f}%"),
        Column("cpu_ips", "cpu img/s", "{:.1f}"),
        Column("gpu_ips", "gpu img/s", "{:.1f}"),
        Column("synthetic_ips", "synthetic img/s", "{:.1f}"),
        Column("cpu_efficiency", "cpu efficiency", "{:.2f}"),
        Column("gpu_efficiency", "gpu efficiency", "{:.2f}"),
        Column("repeats", "repeats"),
    ]
    for sentence in augload_trend(summary, models, loads, modes):
        res.note(sentence)
    res.note(
        f"s/epoch = {n_images} images ÷ steady-state images/s (warm-up steps excluded); "
        "efficiency = images/s ÷ synthetic-data images/s of the same model and batch; medians of "
        "interleaved repeats (each measurement is a row of results.csv, ranges in summary.csv)."
    )
    res.write_markdown(
        "augload: CPU vs GPU preprocessing under augmentation load",
        columns,
        hardware_line,
        summary,
    )
    panels = {
        model: {
            mode: (
                [r["load"] for r in summary if r["model"] == model and r[f"{mode}_epoch_s"]],
                [
                    r[f"{mode}_epoch_s"]
                    for r in summary
                    if r["model"] == model and r[f"{mode}_epoch_s"]
                ],
            )
            for mode in modes
        }
        for model in models
    }
    ceilings = {r["model"]: n_images / r["synthetic_ips"] for r in summary if r["synthetic_ips"]}
    line_panels(
        res.out_dir / "results.png", "seconds per epoch vs augmentation load", panels, "load factor L",
        "s/epoch", ceilings,
    )  # fmt: skip
    res.save()
