"""The training processes' CPU while their steps wait on data and while they compute: measured
across the waits where the steps carry it, else fitted to the process samples."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Callable

Fit = tuple[tuple[float, float], tuple[float, float]]  # (waiting, computing), (low, high)


def measure_wait_cpu(steps: pd.DataFrame, host: str | None) -> tuple[float, float, float]:
    """(% of the wait on a CPU or ready for one, its 2-standard-error margin, % ready) from
    the steps' `data_wait_cpu` and `data_wait_ready`, over the steps (on `host`) that have the
    CPU; NaN unless those steps hold at least half of the data wait."""
    nan = (float("nan"), float("nan"), float("nan"))
    s = steps
    if "data_wait_cpu" not in s or len(s) == 0:
        return nan
    if host is not None:
        s = s[s["host"] == host]
    wait = s["data_wait"].to_numpy(dtype=float)
    cpu = s["data_wait_cpu"].to_numpy(dtype=float)
    ready = s["data_wait_ready"].to_numpy(dtype=float) if "data_wait_ready" in s else cpu * np.nan
    known = np.isfinite(cpu)
    total = float(wait[known].sum())
    if known.sum() < 3 or total <= 0 or total < 0.5 * float(wait.sum()):
        return nan
    w, r = wait[known], ready[known]
    c = cpu[known] + np.nan_to_num(r)
    ratio = float(c.sum()) / total
    residual = c - ratio * w
    se = float(np.sqrt(np.sum(residual**2) * len(w) / (len(w) - 1))) / total
    ready_share = 100.0 * float(r.sum()) / total if np.isfinite(r).all() else float("nan")
    return 100.0 * ratio, 200.0 * se, ready_share


def fit_main_cpu(
    steps: pd.DataFrame,
    processes: pd.DataFrame,
    interval: float,
    host: str | None,
    top: float,
    measured: tuple[float, float, float],
) -> Fit:
    """((CPU while waiting, while computing), (low, high) of the first), % of a core clipped to
    0..`top`: the measured CPU-while-waiting (`measure_wait_cpu`) where there is one, else the
    fit to the process samples (`fit_samples`)."""

    def clip(x: float) -> float:
        return float(min(max(x, 0.0), top))

    fit = fit_samples(steps, processes, interval, host, clip)
    value, margin, _ = measured
    if np.isfinite(value):
        (_, computing), _ = fit
        return (clip(value), computing), (clip(value - margin), clip(value + margin))
    return fit


def fit_samples(
    steps: pd.DataFrame,
    processes: pd.DataFrame,
    interval: float,
    host: str | None,
    clip: Callable[[float], float],
) -> Fit:
    """CPU while waiting and while computing, and the first's range, fitted to the process
    samples alone: cpu = a*f + b*(1-f) by least squares, f the share of a sample's interval
    spent in data wait."""
    nan = (float("nan"), float("nan"))
    f, cpu = wait_shares(steps, processes, interval, host)
    if len(f) == 0:
        return nan, nan
    if f.std() < 0.05:
        if f.mean() > 0.9:
            se = 2 * float(cpu.std()) / max(1.0, np.sqrt(len(cpu)))
            a = float(cpu.mean())
            return (clip(a), float("nan")), (clip(a - se), clip(a + se))
        return nan, nan
    design = np.column_stack([f, 1.0 - f])
    (a, b), *_ = np.linalg.lstsq(design, cpu, rcond=None)
    dof = max(1, len(cpu) - 2)
    sigma2 = float(np.sum((cpu - design @ np.array([a, b])) ** 2)) / dof
    se = 2 * float(np.sqrt(sigma2 * np.linalg.pinv(design.T @ design)[0, 0]))
    return (clip(a), clip(b)), (clip(a - se), clip(a + se))


def wait_shares(
    steps: pd.DataFrame, processes: pd.DataFrame, interval: float, host: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """(f, cpu) per sample of the training processes (on `host`) inside their steps: the share
    of the sample's interval spent in data wait, and the process's CPU % over it."""
    fs, cpus = [np.zeros(0)], [np.zeros(0)]
    if "pid" not in steps:
        return fs[0], cpus[0]
    main = processes[processes["role"] == "main"]
    for (on, pid), s in steps.groupby(["host", "pid"]):
        if host is not None and on != host:
            continue
        m = main[(main["host"] == on) & (main["pid"] == pid)].sort_values("time")
        t_end = m["time"].to_numpy(dtype=float)
        t_start = np.concatenate([t_end[:1] - interval, t_end[:-1]])
        # only samples whose interval these steps cover: one reaching into the warm-up would
        # count its waits as computing, and at the edge of the range it would sway the fit
        inside = (t_start >= s["start"].min()) & (t_end <= s["end"].max())
        if inside.sum() < 3:
            continue
        fs.append(share_inside(s, t_start[inside], t_end[inside]))
        cpus.append(m["cpu"].to_numpy(dtype=float)[inside])
    return np.concatenate(fs), np.concatenate(cpus)


def share_inside(steps: pd.DataFrame, t_start: np.ndarray, t_end: np.ndarray) -> np.ndarray:
    """Share of each interval [t_start, t_end] that the steps of one process spent in data wait."""
    s = steps.sort_values("start")
    begin = s["start"].to_numpy(dtype=float)
    wait = s["data_wait"].to_numpy(dtype=float)
    # W(t): total wait before t, piecewise linear through each wait span's start and end.
    cum = np.concatenate([[0.0], np.cumsum(wait)[:-1]])
    xs = np.column_stack([begin, begin + wait]).ravel()
    ys = np.column_stack([cum, cum + wait]).ravel()
    span = np.maximum(t_end - t_start, 1e-9)
    return np.clip((np.interp(t_end, xs, ys) - np.interp(t_start, xs, ys)) / span, 0.0, 1.0)
