"""`gpufeed export`: load a run and write it for other tools (TensorBoard event files)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path


def export_tensorboard(
    run_path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    echo: Callable[[str], None] = print,
) -> Path:
    """Write the run (one or several run directories) as TensorBoard event files under
    `out/RUN` (RUN: the run directory's name), so that runs exported into one folder stay apart
    in TensorBoard; returns `out/RUN`. Refuses to add to an earlier export of the same run.
    Every scalar is on the training-step axis (system samples: the mean of each step's, see
    `gpufeed.present.tensorboard`), with its unit in its tag and its wall time."""
    from gpufeed.analysis.run import load
    from gpufeed.present.tensorboard import (
        ExportError,
        run_folder,
        summary_writer,
        tensorboard_scalars,
    )

    writer_class = summary_writer()
    run = load(run_path)
    if len(run.steps) == 0 and len(run.system) == 0:
        raise ExportError(f"{run.path} holds no steps and no system samples: nothing to export")
    base = Path(out)
    target = base / run_folder(run)
    if target.is_dir() and any(target.iterdir()):
        raise ExportError(
            f"--tensorboard {base}: {target} already holds an export of this run (TensorBoard "
            "would show both, doubled): remove that folder first, or give another folder"
        )
    scalars = 0
    for name, series in tensorboard_scalars(run).items():
        writer = writer_class(log_dir=str(target / name))
        try:
            for tag, step, value, wall in series:
                writer.add_scalar(tag, value, global_step=step, walltime=wall)
                scalars += 1
        finally:
            writer.close()
    echo(
        f"gpufeed: TensorBoard events written to {target} ({scalars:,} scalars): "
        f"tensorboard --logdir {base}"
    )
    return target
