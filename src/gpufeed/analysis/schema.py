"""The schema of a `Run`, as one table: every frame's columns, the system metrics and the meta keys,
each with its unit and meaning. A contract between profile, analyze and present.

Frames keep base units (seconds, bytes, bytes/s, %); `UNITS` says how each is shown (memory in GiB,
rates in MB/s) by `gpufeed show`, the HTML report and the TensorBoard export. `run.py` derives its
column lists from here, `gpufeed.load`'s docstring shows `frames_text()`, and the docs site renders
`frames_markdown()`. Pure Python: `import gpufeed` imports it, so it must not import pandas.
"""

from typing import NamedTuple  # not dataclasses, whose import of inspect `import gpufeed` would pay

# no `from __future__ import annotations`: NamedTuple would compile each string annotation

RELATIVE_TIME = "t"  # the column of seconds since the run started, in every frame with times


class Field(NamedTuple):
    """One column (or system metric, or meta key): its name, unit in the frame, and meaning."""

    name: str
    unit: str
    meaning: str
    added: bool = False  # added by `gpufeed.load`: a frame built by hand may lack it


class Frame(NamedTuple):
    """One attribute of a `Run`: what a row is, and its fields."""

    name: str
    what: str
    fields: tuple[Field, ...]
    head: tuple[str, str, str] = ("column", "unit", "meaning")


class Unit(NamedTuple):
    """How values stored in one unit are shown: `value / divisor` in `shown`, to `decimals`
    places; `tag` names the unit in TensorBoard tags (no spaces or slashes)."""

    stored: str
    shown: str
    divisor: float
    decimals: int
    tag: str


# One display unit per quantity, everywhere gpufeed shows it (show, report, TensorBoard).
UNITS: dict[str, Unit] = {
    u.stored: u
    for u in (
        Unit("bytes", "GiB", 2**30, 2, "GiB"),
        Unit("bytes/s", "MB/s", 1e6, 2, "MBps"),
        Unit("%", "%", 1.0, 1, "percent"),
        Unit("W", "W", 1.0, 1, "W"),
        Unit("MHz", "MHz", 1.0, 0, "MHz"),
    )
}
_PLAIN = Unit("", "", 1.0, 2, "")

_EPOCH = "epoch s"
_SINCE = "s"
_T_SAMPLE = Field(
    RELATIVE_TIME,
    _SINCE,
    "seconds since the run started (meta `start_time`; of the earliest part for several "
    "hosts; the first record where it is unknown) to `time`",
    added=True,
)
_T_SPAN = Field(
    RELATIVE_TIME,
    _SINCE,
    "seconds since the run started (as in `system`) to `end` (always known, where `start` may "
    "not be): the row began at `t - duration`",
    added=True,
)
_HOST = Field("host", "str", "host name the row was recorded on")
_PHASE = "host clock, on a GPU launch time, not GPU work; NaN where the hooks did not see the model"
_GPU_PHASE = "CUDA events at the host phase's points; NaN unless the model is on a CUDA device"

STEPS = Frame(
    "steps",
    "One row per training step per rank. A step spans from the end of the previous step (or the "
    "first batch request) to the end of its optimizer step, so `duration` includes `data_wait`. "
    "`analysis.stats.phase_columns` picks the GPU clock where it was measured.",
    (
        _HOST,
        Field("rank", "int", "global rank of the training process; 0 for single-process runs"),
        Field("local_rank", "int", "rank on its host"),
        Field("pid", "int", "process id of the training process"),
        Field("step", "int", "the step's number on its rank"),
        Field(
            "start",
            _EPOCH,
            "when the step began; NaN where unknown (the first step of a process that asked no "
            "DataLoader for a batch before it, outside `gpufeed.profile()`)",
        ),
        Field("end", _EPOCH, "when its optimizer step ended"),
        Field("duration", "s", "`end - start`, including `data_wait`; NaN where start is"),
        Field("data_wait", "s", "time blocked on the DataLoader iterator"),
        Field("samples", "count", "leading dimension of the batch; NaN if unknown"),
        Field("gpu_time", "s", "GPU work from CUDA events; NaN on CPU"),
        Field("forward", "s", f"in the trained model's forward ({_PHASE})"),
        Field("backward", "s", f"in backward passes ({_PHASE})"),
        Field("optimizer", "s", f"in optimizer steps ({_PHASE})"),
        Field("other", "s", "`duration` minus `data_wait`, forward, backward and optimizer"),
        Field("gpu_forward", "s", f"forward on the GPU clock ({_GPU_PHASE})"),
        Field("gpu_backward", "s", f"backward on the GPU clock ({_GPU_PHASE})"),
        Field("gpu_optimizer", "s", f"optimizer on the GPU clock ({_GPU_PHASE})"),
        Field(
            "data_wait_cpu",
            "s",
            "CPU the training thread (the one iterating the DataLoader) used while the step waited "
            "on it: about `data_wait` when it loads the data itself (num_workers=0), near 0 when "
            "it sleeps on workers or a slow disk; NaN where not measured",
        ),
        Field(
            "data_wait_ready",
            "s",
            "of that wait, time the thread was ready to run but kept off a core (a busy host); "
            "NaN where not measured (also off Linux)",
        ),
        _T_SPAN,
    ),
)

HEADSPACE = Frame(
    "headspace",
    "The steps `gpufeed profile --headspace N` fed one kept batch, kept out of `steps`: the job's "
    "step time without waiting on input (`analysis.headspace`). Same columns as `steps`; empty "
    "unless asked for.",
    STEPS.fields,
)

SYSTEM = Frame(
    "system",
    "One row per sampled metric, device and time (long format). Units per metric: see "
    "`system metrics`. GPU rows exist only where NVML reported them; nothing is invented.",
    (
        Field("time", _EPOCH, "when the sample was taken"),
        _HOST,
        Field("metric", "str", "metric name, one of `system metrics`"),
        Field("device", "str", 'core or GPU index ("0", "1", ...); "" for host-wide metrics'),
        Field("value", "per metric", "the sample, in the metric's unit"),
        _T_SAMPLE,
    ),
)

METRICS = Frame(
    "system metrics",
    "The `metric` values of `system`, with the unit of `value`.",
    (
        Field("cpu.util", "%", 'whole-host CPU busy, 0-100 (device "")'),
        Field("cpu.core", "%", 'per-core busy, 0-100 (device "0".."N-1")'),
        Field("cpu.iowait", "%", "CPU time in iowait, 0-100"),
        Field(
            "mem.used",
            "bytes",
            "host memory used (in a container with a lower memory limit: its working set)",
        ),
        Field("mem.total", "bytes", "host memory (in a container with a lower limit: that limit)"),
        Field("disk.read", "bytes/s", "read, all disks"),
        Field("disk.write", "bytes/s", "written, all disks"),
        Field("net.rx", "bytes/s", "received, all interfaces except loopback"),
        Field("net.tx", "bytes/s", "sent, all interfaces except loopback"),
        Field(
            "gpu.util",
            "%",
            "time a kernel was running, 0-100 (NVML utilization.gpu; not SM occupancy)",
        ),
        Field("gpu.mem_util", "%", "memory-controller utilization, 0-100"),
        Field("gpu.mem_used", "bytes", "GPU memory used"),
        Field("gpu.mem_total", "bytes", "GPU memory"),
        Field("gpu.power", "W", "power draw"),
        Field("gpu.sm_clock", "MHz", "SM clock"),
        Field("gpu.pcie_rx", "bytes/s", "PCIe received by the GPU"),
        Field("gpu.pcie_tx", "bytes/s", "PCIe sent by the GPU"),
    ),
    ("metric", "unit", "meaning"),
)

PROCESSES = Frame(
    "processes",
    "One row per process of the run's process tree per sample time.",
    (
        Field("time", _EPOCH, "when the sample was taken"),
        _HOST,
        Field("pid", "int", "process id"),
        Field(
            "role",
            "str",
            '"main" (a training process, one per rank), "worker" (a DataLoader worker) or '
            '"other" (anything else in the tree)',
        ),
        Field("cpu", "% of one core", "CPU use; can exceed 100"),
        Field("rss", "bytes", "resident memory"),
        _T_SAMPLE,
    ),
)

EVALS = Frame(
    "evals",
    "One row per evaluation pass (a loop over batches under `torch.no_grad()` / `model.eval()` "
    "between training steps), apart from the training steps.",
    (
        _HOST,
        Field("rank", "int", "global rank"),
        Field("pid", "int", "process id of the training process"),
        Field("start", _EPOCH, "when the pass began"),
        Field("end", _EPOCH, "when it ended"),
        Field("duration", "s", "`end - start`"),
        Field("batches", "count", "batches evaluated"),
        Field("samples", "count", "samples evaluated; NaN if unknown"),
        Field("data_wait", "s", "time blocked on its DataLoader; NaN where not measured"),
        _T_SPAN,
    ),
)

WORKERS = Frame(
    "workers",
    "A dict, not a frame: host -> set of pids of the DataLoader worker processes the training "
    "processes' hooks saw there.",
    (),
)

_RANK = "per training process (`meta.ranks[i]`): "
META = Frame(
    "meta",
    "A dict. Several run directories loaded as one (one per host, `analysis.combine`) cover all "
    "parts in times, hosts, ranks and counts.",
    (
        Field("name", "str", "the run's name"),
        Field("command", "list[str]", "the profiled command, secrets redacted"),
        Field("start_time", _EPOCH, "when profiling started (the earliest part's)"),
        Field("end_time", _EPOCH, "when it ended; None while running or when killed"),
        Field("exit_code", "int", "the command's exit code"),
        Field("interval", "s", "sampling interval (the sparsest host's)"),
        Field("hosts", "list[str]", "hosts of the run"),
        Field("cpu_count", "int", "cores the run may use (`gpufeed.cores.usable_cores`)"),
        Field("cpu_model", "str", "CPU model name"),
        Field("gpus", "list[dict]", "one dict per GPU: index, name, memory_total (bytes)"),
        Field("gpus[i].compute_capability", "str", 'e.g. "8.0"; optional, read by MixedPrecision'),
        Field("gpus[i].host", "str", "its host (several parts only)"),
        Field("gpu_unavailable", "str", "why GPUs were not read; absent when they were"),
        Field("versions", "dict", "versions of Python, torch, gpufeed ..."),
        Field("dropped_events", "int", "profiler events dropped"),
        Field(
            "damaged_stores",
            "list[str]",
            '"FILE (why)" per store file that could not be read and is left out; absent when '
            "every one was read",
        ),
        Field(
            "ranks",
            "list[dict]",
            "one dict per training process: host, rank, local_rank, world_size, pid, start, end "
            "(epoch s: for the initialization and finalization phases) and the keys below",
        ),
        Field("ranks[i].precision", "str", _RANK + "as `precision`; None where not shown"),
        Field("ranks[i].cuda", "bool", _RANK + "whether it initialized CUDA; None if not recorded"),
        Field(
            "ranks[i].loader_workers",
            "int",
            _RANK + "most worker processes of a DataLoader that fed its training steps, as its "
            "hooks saw them; None if not recorded",
        ),
        Field(
            "ranks[i].batch_kind",
            "str",
            _RANK + '"image" when its DataLoader delivered N×C×H×W tensors, "other" otherwise, '
            "None if not seen",
        ),
        Field(
            "ranks[i].headspace",
            "list[int]",
            _RANK + "[first, last] step fed a kept batch; absent where none was",
        ),
        Field("finished", "bool", "the run wrote its end time"),
        Field(
            "not_finished",
            "str",
            "why not, only when not finished: still running or killed",
        ),
        Field(
            "headspace",
            "int",
            "steps `gpufeed profile --headspace N` was asked to feed a kept batch; absent when not",
        ),
        Field("error", "str", "why the command could not be started; absent when it was"),
        Field("meta_error", "str", "which facts could not be recorded; absent when all were"),
        Field("env", "dict", "performance-relevant environment variables, secrets redacted"),
        Field("cwd", "str", "working directory"),
        Field("platform", "str", "operating system"),
        Field(
            "precision",
            "str",
            '"fp32", "fp16", "bf16" or "mixed": the ranks\' common precision ("mixed" when they '
            "differ; absent when none showed one). A process's precision is the autocast dtype "
            "if at least half its steps ran under an enabled `torch.autocast`, else the dtype of "
            "most of its optimizer's parameter elements",
        ),
        Field("parts", "list[str]", "several parts only: the run directories, earliest first"),
        Field(
            "host_cpu_counts",
            "dict[str, int]",
            "several parts only: cpu_count per host (`cpu_count` stays the first part's)",
        ),
    ),
    ("key", "type", "meaning"),
)

FRAMES: tuple[Frame, ...] = (STEPS, HEADSPACE, SYSTEM, METRICS, PROCESSES, EVALS, WORKERS, META)


def columns(frame: Frame) -> list[str]:
    """The columns every frame of this kind has, built by `load` or by hand: without the ones
    `load` adds (the relative time), which code must not require."""
    return [f.name for f in frame.fields if not f.added]


def unit(metric: str) -> Unit:
    """How a system metric's values are shown; unit-less for a metric the table does not know."""
    stored = next((f.unit for f in METRICS.fields if f.name == metric), "")
    return UNITS.get(stored, _PLAIN)


def frames_markdown() -> str:
    """The schema as Markdown: per frame a heading, what a row is, and a table of its fields."""
    shown = ", ".join(f"{u.stored} as {u.shown}" for u in UNITS.values() if u.stored != u.shown)
    out = [
        f"Times are float seconds since the Unix epoch ({_EPOCH}) unless said; `{RELATIVE_TIME}` "
        f"is seconds since the run started. Frames keep base units; shown: {shown}."
    ]
    for frame in FRAMES:
        out += [f"## {_title(frame, '`')}", frame.what]
        if frame is HEADSPACE or not frame.fields:
            continue
        rows = [frame.head, ("---", "---", "---")]
        rows += [(f"`{f.name}`", f.unit, f.meaning) for f in frame.fields]
        out.append("\n".join("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows))
    return "\n\n".join(out) + "\n"


def frames_text(width: int = 100) -> str:
    """The schema as plain text for `help(gpufeed.load)`: per frame its fields, meanings wrapped."""
    shown = ", ".join(f"{u.stored} as {u.shown}" for u in UNITS.values() if u.stored != u.shown)
    out = _wrap(
        f"Frames. Times are {_EPOCH} (seconds since the Unix epoch) unless said; {RELATIVE_TIME} "
        f"is seconds since the run started. Frames keep base units; shown: {shown}.",
        width,
    )
    for frame in FRAMES:
        out.append("")
        head = _wrap(f"{_title(frame)}: {frame.what}", width - 4)
        out += [head[0], *("    " + line for line in head[1:])]
        if frame is HEADSPACE:
            continue
        name_w = max((len(f.name) for f in frame.fields), default=0)
        unit_w = max((len(f.unit) for f in frame.fields), default=0)
        for f in frame.fields:
            lead = f"    {f.name:<{name_w}}  {f.unit:<{unit_w}}  "
            lines = _wrap(f.meaning, max(width - len(lead), 30))
            out += [lead + lines[0], *(" " * len(lead) + line for line in lines[1:])]
    return "\n".join(line.rstrip() for line in out) + "\n"


def _title(frame: Frame, quote: str = "") -> str:
    return frame.name.capitalize() if " " in frame.name else f"{quote}run.{frame.name}{quote}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap into lines of at most `width` (a longer word gets its own line); not
    textwrap, whose import `import gpufeed` would pay."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]
