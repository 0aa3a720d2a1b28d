"""`gpufeed export`: load a run, put its figures on the training-step axis (`analysis.step_scalars`)
and write them for other tools (TensorBoard event files)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from gpufeed.text import visible


def export_tensorboard(
    run_path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    echo: Callable[[str], None] = print,
) -> Path:
    """Write the run (one or several run directories) as TensorBoard event files under
    `out/RUN` (RUN: the run directory's name), so that runs exported into one folder stay apart
    in TensorBoard; returns `out/RUN`. Refuses to add to an earlier export of the same run.
    Every scalar is on the training-step axis (system samples: the mean of each step's, see
    `gpufeed.analysis.step_scalars`), with its unit in its tag and its wall time.

    All or nothing: the files are written into a hidden folder beside `out/RUN` and renamed to
    it once complete; where they cannot be (a full disk), that folder is removed and the OSError
    raised names `out/RUN`."""
    from gpufeed.analysis.run import load
    from gpufeed.analysis.step_scalars import step_scalars
    from gpufeed.present.tensorboard import ExportError, check_extra, run_folder

    check_extra()
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
    made_base = not base.exists()
    staging = base / f".{target.name}.{os.getpid()}.tmp"
    try:
        scalars = _write_all(staging, step_scalars(run))
        os.replace(staging, target)
    except BaseException as e:
        began = staging.exists()  # else the folder could not even be made in `out`
        shutil.rmtree(staging, ignore_errors=True)
        if made_base:
            with contextlib.suppress(OSError):
                base.rmdir()
        if isinstance(e, OSError):  # a write error names no file: name the export's folder
            where = target if began else base
            raise OSError(e.errno, e.strerror, str(where)) from None
        raise
    echo(
        f"gpufeed: TensorBoard events written to {visible(target)} ({scalars:,} scalars): "
        f"tensorboard --logdir {visible(base)}"
    )
    return target


def _write_all(folder: Path, runs: dict[str, list]) -> int:
    """One event file per TensorBoard run under `folder`, on disk (fsync) when this returns;
    the number of scalars written."""
    from gpufeed.present.tensorboard import event_file_name, event_records

    for name, series in runs.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        with open(folder / name / event_file_name(), "wb") as f:
            for record in event_records(series):
                f.write(record)
            f.flush()
            os.fsync(f.fileno())
    return sum(len(series) for series in runs.values())
