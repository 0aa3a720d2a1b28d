"""A run's figures as scalars on the training-step axis: what `gpufeed export --tensorboard` writes
(`present.tensorboard` encodes them as event files).

One series per training process, ``<host>/rank<N>``, with ``step/*`` scalars, and one per host,
``<host>/system``, with ``system/<metric>_<unit>[/<device>]`` and ``processes/cpu_<role>_percent``.
Every tag names its unit: system metrics in the display units of `gpufeed.analysis.schema.UNITS`
(memory GiB, rates MB/s, %, W, MHz), step times in ms.

All of them are on the training-step axis, so TensorBoard's default STEP axis lines ``system/*``
up with ``step/*``: a system or process sample belongs to the step that was running at its time
on its host (the host's lowest rank; a host without training steps: the run's lowest rank), i.e.
the step whose span (start, end] holds the sample. TensorBoard keeps one value per tag and step (a
later one at the same step replaces the earlier), so each tag gets the mean of a step's samples.
Samples taken while no step ran (before the first step, in a gap between steps such as an
evaluation pass, after the last step) are left out. A run without any training step keeps one
step per sample time (its index). Every scalar carries a wall time: a step's end, or the sample's
time where there are no steps, so TensorBoard's "relative" and "wall" axes line up with the
training's own logs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.analysis.schema import unit
from gpufeed.profiler.session import file_safe

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.frames import Run

Scalar = tuple[str, int, float, float]  # (tag, step, value, wall time)


def step_scalars(run: Run) -> dict[str, list[Scalar]]:
    """(tag, step, value, wall time) per TensorBoard run name ("<host>/rank<N>", "<host>/system"):
    what `gpufeed export --tensorboard` writes, every scalar on the training-step axis."""
    out: dict[str, list[Scalar]] = {}
    steps = run.steps[np.isfinite(run.steps["end"].to_numpy(dtype=float))]
    for (host, rank), g in steps.groupby(["host", "rank"], sort=True):
        rows = out.setdefault(f"{_safe(host)}/rank{int(rank)}", [])
        for s in g.itertuples():
            step, wall = int(s.step), float(s.end)
            if math.isfinite(s.duration):
                rows.append(("step/time_ms", step, 1e3 * s.duration, wall))
                if math.isfinite(s.samples) and s.duration > 0:
                    rows.append(
                        ("step/throughput_samples_per_s", step, s.samples / s.duration, wall)
                    )
            if math.isfinite(s.data_wait):
                rows.append(("step/data_wait_ms", step, 1e3 * s.data_wait, wall))
            for tag, v in (("cpu", s.data_wait_cpu), ("ready", s.data_wait_ready)):
                if math.isfinite(v):
                    rows.append((f"step/data_wait_{tag}_ms", step, 1e3 * v, wall))
            if math.isfinite(s.gpu_time):
                rows.append(("step/gpu_time_ms", step, 1e3 * s.gpu_time, wall))
    system, processes = run.system, run.processes
    for host in sorted({str(h) for h in [*system["host"].unique(), *processes["host"].unique()]}):
        samples = _samples(system[system["host"] == host], processes[processes["host"] == host])
        out[f"{_safe(host)}/system"] = _on_axis(samples, step_axis(steps, host))
    return out


def step_axis(steps: pd.DataFrame, host: str) -> pd.DataFrame | None:
    """The steps (step, start, end; by end) that system samples of `host` are placed on: those of
    its lowest rank, or of the run's lowest rank where `host` ran none; None without steps. An
    unknown start is the previous step's end (a step spans from it)."""
    own = steps[steps["host"].astype(str) == host]
    pick = own if len(own) else steps
    if len(pick) == 0:
        return None
    lowest = pick[pick["rank"] == pick["rank"].min()]
    if len(own) == 0:  # the lowest rank of one host only
        lowest = lowest[lowest["host"] == lowest["host"].min()]
    axis = lowest[["step", "start", "end"]].sort_values("end", kind="stable")
    axis = axis.astype(float).reset_index(drop=True)
    axis["start"] = axis["start"].fillna(axis["end"].shift())
    return axis


def step_at(axis: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Per time, the row of `axis` whose span (start, end] holds it (the first step: [start,
    end]); -1 where no step was running."""
    ends = axis["end"].to_numpy(float)
    starts = axis["start"].to_numpy(float)
    i = np.searchsorted(ends, times, side="left")
    inside = i < len(ends)
    j = np.where(inside, i, 0)
    inside &= starts[j] <= times  # NaN start (unknown): not inside
    return np.where(inside, j, -1)


def _samples(system: pd.DataFrame, processes: pd.DataFrame) -> pd.DataFrame:
    """One host's samples as (tag, time, value) in display units: system metrics, and the CPU of
    each process role summed per sample time."""
    import pandas as pd

    system = system[np.isfinite(system["value"].to_numpy(dtype=float))]
    units = {str(m): unit(str(m)) for m in system["metric"].unique()}
    suffix = {m: f"_{u.tag}" if u.tag else "" for m, u in units.items()}
    metric = system["metric"].astype(str)
    device = system["device"].map(lambda d: f"/{d}" if d else "")
    tag = "system/" + metric + metric.map(suffix) + device
    sys_rows = pd.DataFrame(
        {
            "tag": tag,
            "time": system["time"].astype(float),
            "value": system["value"].astype(float) / metric.map(lambda m: units[m].divisor),
        }
    )
    cpu = processes.groupby(["time", "role"], observed=True)["cpu"].sum().reset_index()
    proc_rows = pd.DataFrame(
        {
            "tag": "processes/cpu_" + cpu["role"].astype(str) + "_percent",
            "time": cpu["time"].astype(float),
            "value": cpu["cpu"].astype(float),
        }
    )
    frames = [f for f in (sys_rows, proc_rows) if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else sys_rows


def _on_axis(samples: pd.DataFrame, axis: pd.DataFrame | None) -> list[Scalar]:
    """Samples as scalars: per tag the mean of each step's samples at that step and its end; with
    no axis, one step per sample time (its index) at that time."""
    times = samples["time"].to_numpy(float)
    if axis is None:
        unique = np.unique(times)
        where = np.searchsorted(unique, times)
        steps, walls = np.arange(len(unique)), unique
    else:
        where = step_at(axis, times)
        steps, walls = axis["step"].to_numpy(int), axis["end"].to_numpy(float)
    kept = samples.assign(at=where)[where >= 0]
    means = kept.groupby(["tag", "at"], sort=True)["value"].mean()
    return [
        (str(tag), int(steps[at]), float(value), float(walls[at]))
        for (tag, at), value in means.items()
    ]


def _safe(text: Any) -> str:
    return file_safe(str(text))
