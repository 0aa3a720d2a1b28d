"""TensorBoard export: a run's step time, data wait, throughput and system metrics as scalars.

Under a folder named after the run directory (``<run>/``: runs exported into one folder stay
apart), one TensorBoard run (sub-folder) per training process, ``<host>/rank<N>``, with ``step/*``
scalars by training step, and one per host, ``<host>/system``, with ``system/<metric>[/<device>]``
and ``processes/cpu_<role>`` by sample; every event carries the wall time it was measured at, so
TensorBoard's "relative" and "wall" axes line up with the training's own logs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.errors import GpufeedError
from gpufeed.extras import MissingExtra, require

if TYPE_CHECKING:
    from gpufeed.analysis.run import Run

# Scale and unit per metric prefix, so that tags read in familiar units.
_SCALE = {"mem.": (1e-9, "GB"), "gpu.mem_used": (1e-9, "GB"), "gpu.mem_total": (1e-9, "GB")}
_RATES = ("disk.", "net.", "gpu.pcie")


class ExportError(GpufeedError, ValueError):
    """The export cannot be written (a missing extra, nothing to write); the message says what to do."""


def tensorboard_scalars(run: Run) -> dict[str, list[tuple[str, int, float, float]]]:
    """(tag, step, value, wall time) per TensorBoard run name; what `gpufeed export --tensorboard` writes."""
    out: dict[str, list[tuple[str, int, float, float]]] = {}
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
        # one step number per sample time of the host, shared by its system and process series
        g, p = system[system["host"] == host], processes[processes["host"] == host]
        times = np.unique(np.concatenate([g["time"].to_numpy(float), p["time"].to_numpy(float)]))
        index = {float(t): i for i, t in enumerate(times)}
        rows = out.setdefault(f"{_safe(host)}/system", [])
        for s in g.itertuples():
            if math.isfinite(s.value):
                scale, unit = _unit(str(s.metric))
                tag = f"system/{s.metric}{unit}" + (f"/{s.device}" if s.device else "")
                rows.append((tag, index[float(s.time)], s.value * scale, float(s.time)))
        for (t, role), cpu in p.groupby(["time", "role"], observed=True)["cpu"].sum().items():
            rows.append((f"processes/cpu_{role}_percent", index[float(t)], float(cpu), float(t)))
    return out


def run_folder(run: Run) -> str:
    """The folder of `run`'s TensorBoard runs: its run directory's name (of the first, for a run
    read from several), made safe to name a folder."""
    return _safe(Path(run.path).resolve().name)


def _unit(metric: str) -> tuple[float, str]:
    scale, unit = next((v for k, v in _SCALE.items() if metric.startswith(k)), (1.0, ""))
    if metric.startswith(_RATES):
        return 1e-6, "_MBps"
    return scale, f"_{unit}" if unit else ""


def _safe(text: Any) -> str:
    from gpufeed.profiler.session import file_safe

    return file_safe(str(text))


def summary_writer() -> Any:
    """torch's SummaryWriter class, or an ExportError saying how to install the tensorboard extra."""
    try:
        require("tensorboard")
    except MissingExtra as e:
        raise ExportError(str(e)) from None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter
