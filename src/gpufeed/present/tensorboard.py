"""TensorBoard export: a run's scalars (`analysis.step_scalars`: step time, data wait,
throughput and system metrics on the training-step axis) written as TensorBoard event files.

Under a folder named after the run directory (``<run>/``: runs exported into one folder stay
apart), one TensorBoard run (sub-folder) per series of `step_scalars`: ``<host>/rank<N>`` per
training process and ``<host>/system`` per host. This module only encodes them: the event
records torch's `SummaryWriter.add_scalar` would write, and the names of the folder and files."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.errors import GpufeedError
from gpufeed.extras import MissingExtra, require

if TYPE_CHECKING:
    from gpufeed.analysis.run import Run
    from gpufeed.analysis.step_scalars import Scalar


class ExportError(GpufeedError, ValueError):
    """The export cannot be written (a missing extra, nothing to write); the message says what to do."""


def run_folder(run: Run) -> str:
    """The folder of `run`'s TensorBoard runs: its run directory's name (of the first, for a run
    read from several), made safe to name a folder."""
    return _safe(Path(run.path).resolve().name)


def _safe(text: Any) -> str:
    from gpufeed.profiler.session import file_safe

    return file_safe(str(text))


def check_extra() -> None:
    """An ExportError saying how to install the tensorboard extra, where it is missing."""
    try:
        require("tensorboard")
    except MissingExtra as e:
        raise ExportError(str(e)) from None


def event_file_name() -> str:
    """A file name TensorBoard reads as an event file, the one its own writer would give."""
    return f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.0"


def event_records(series: Iterable[Scalar]) -> Iterator[bytes]:
    """An event file's bytes, record by record: its version, then each scalar as torch's
    `SummaryWriter.add_scalar` writes it. Rendered here, written by the caller in its own thread,
    so that a write error reaches it (TensorBoard's writer fails in a thread of its own)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    def record(event: Any) -> bytes:  # TFRecord: length, its masked CRC, data, the data's CRC
        data = event.SerializeToString()
        head = struct.pack("<Q", len(data))
        crcs = struct.pack("<I", masked_crc32c(head)), struct.pack("<I", masked_crc32c(data))
        return b"".join((head, crcs[0], data, crcs[1]))

    yield record(Event(wall_time=time.time(), file_version="brain.Event:2"))
    for tag, step, value, wall in series:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        yield record(Event(wall_time=wall, step=step, summary=summary))
