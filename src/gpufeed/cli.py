"""Thin command line: every command parses its options and calls one function in a module below.

Options default to the library's own defaults (read from the function signatures, never restated).
The heavy parts (torch, pandas) are imported inside each command so that `gpufeed --help` stays fast.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from gpufeed.advise.diagnose import diagnose
from gpufeed.advise.tune import tune
from gpufeed.data.packing import pack, printable
from gpufeed.data.source import DEFAULT_TIMEOUT
from gpufeed.demo.compare import DEFAULT_WORK_DIR, GPU_IMAGE_SIZE, DemoConfig
from gpufeed.errors import GpufeedError
from gpufeed.output_paths import check_distinct, check_output_dir, check_output_file
from gpufeed.present.trace import MAX_MB
from gpufeed.profiler.launch import profile_command
from gpufeed.text import visible


def default(function: Callable[..., Any], parameter: str) -> Any:
    """The library's default for `parameter` of `function`, so the CLI never restates it."""
    return inspect.signature(function).parameters[parameter].default


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error in red to stderr and return the Exit to raise (the one handler's)."""
    typer.secho(
        f"gpufeed: error: {visible(message, keep_newlines=True)}", err=True, fg=typer.colors.RED
    )
    return typer.Exit(code)


class Commands(TyperGroup):
    """The command group with gpufeed's one error handler: any GpufeedError a command raises
    becomes one `gpufeed: error: MESSAGE` line and the error's exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except GpufeedError as e:
            raise fail(str(e), e.exit_code) from None


# A command's docstring is its --help text: each paragraph on one line (however long), since
# typer keeps a line break inside a paragraph, which wraps raggedly at other terminal widths.
app = typer.Typer(
    cls=Commands,
    name="gpufeed",
    help="Find out why GPU training is slow, and keep the GPU fed.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def check_utf8(option: str, value: str | None) -> None:
    """Refuse a name or path that is not valid UTF-8 (bytes of another encoding, which Python keeps
    as lone surrogates): reports, JSON and TensorBoard could not hold it."""
    if value is None:
        return
    try:
        value.encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    raise GpufeedError(
        f"{option} {printable(value)}: not valid UTF-8 (bytes of another encoding, shown as \\xNN): "
        "give it in UTF-8 (plain ASCII is always fine)"
    )


def written(error: OSError, *targets: str | None) -> str:
    """The file the user named that `error` was about (writers go through a hidden temporary
    name next to it), else the file the error names."""
    import os

    where = str(error.filename or "")
    folder, name = os.path.split(os.path.abspath(where))
    named = [
        t
        for t in targets
        if t and os.path.split(os.path.abspath(t))[0] == folder and os.path.basename(t) in name
    ]
    return named[0] if named else where


def cannot_write(error: OSError, option: str, *given: str | None) -> str:
    """`cannot write FILE: why`; where FILE is the command's default (no option named it), how
    to write elsewhere (a run on a read-only mount is read fine, its report goes elsewhere)."""
    path = written(error, *given)
    hint = "" if path in given else f"; give {option} FILE in a folder you can write to"
    return f"cannot write {path}: {error.strerror or error}{hint}"


def echo_result(result: object, err: bool = False) -> None:
    """Print what a command returned (it renders itself: `__rich__`) on stdout (stderr with
    `err`); long lines of evidence stay whole for the terminal to wrap."""
    from rich.console import Console

    Console(stderr=err).print(result, crop=False)


def onto_stdout(*outputs: str | None) -> bool:
    """Whether one of the output files given is this process's stdout (`--json /dev/stdout`):
    then what the command says goes to stderr, leaving stdout to the data."""
    from gpufeed.atomic import descriptor

    return any(o is not None and descriptor(o) == 1 for o in outputs)


def say(err: bool) -> Callable[[str], None]:
    """typer.echo, on stderr with `err` (see `onto_stdout`)."""
    return lambda message: typer.echo(message, err=err)


def check_seconds(option: str, value: float | None) -> None:
    """Refuse a duration that is not a finite number of seconds above 0."""
    if value is not None and not 0 < value < math.inf:
        raise GpufeedError(f"{option} {value:g}: give a number of seconds above 0, e.g. {option} 4")


AUGMENT_LOAD_HELP = (
    "Augmentation of the images measured: 0 = the ImageNet recipe (random-resized crop, flip); "
    "L = that plus L x (flips, rotation up to ±15°), each rotation one more resampling."
)
MOST_AUGMENT_LOAD = 64  # 64 resamplings per image: far beyond any recipe, and still minutes


TIMEOUT_HELP = (
    f"Seconds one s3:// read or write may take, retries included (default {DEFAULT_TIMEOUT:g})."
)


def remote_options(timeout: float | None) -> dict[str, float] | None:
    """The storage_options of a command's `--timeout` (None: the default deadline)."""
    check_seconds("--timeout", timeout)
    return None if timeout is None else {"timeout": timeout}


def check_count(option: str, value: int | None, least: int, most: int | None = None) -> None:
    """Refuse a count below `least` (or above `most`)."""
    if value is not None and value < least:
        raise GpufeedError(f"{option} {value}: must be {least} or more")
    if value is not None and most is not None and value > most:
        raise GpufeedError(f"{option} {value}: must be {most} or less")


# --- COLLECT: profile, show, ls ---------------------------------------------------------------

DEFAULT_RUNS_DIR = "gpufeed-runs"


def check_command(command: list[str]) -> None:
    """Refuse, with what to type instead, a first word that is an option gpufeed does not know
    (unknown options are let through to reach COMMAND) or a file that cannot be run as it is."""
    import os
    import shutil

    from gpufeed.profiler.session import ProfileError

    if not command:
        return
    prog = command[0]
    if prog.startswith("-"):
        raise ProfileError(
            f"no such option {prog.split('=', 1)[0]} (see `gpufeed profile --help`); "
            "put the command after `--`: gpufeed profile [OPTIONS] -- COMMAND ..."
        )
    python = f"`gpufeed profile -- python {prog}`" if prog.endswith(".py") else None
    if os.sep in prog and os.path.isfile(prog) and not os.access(prog, os.X_OK):
        fix = (
            f"run it with Python, {python}"
            if python
            else f"make it executable (chmod +x {prog}) or run it with its interpreter, "
            f"e.g. `gpufeed profile -- bash {prog}`"
        )
        raise ProfileError(f"{prog} is not executable: {fix}", exit_code=126)
    if os.sep not in prog and os.path.isfile(prog) and shutil.which(prog) is None:
        raise ProfileError(
            f"{prog!r} is not a command on PATH; to run the file {prog} here: "
            + (python or f"`gpufeed profile -- ./{prog}`"),
            exit_code=127,
        )


@app.command(
    "profile",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def profile_cmd(
    command: Annotated[
        list[str] | None, typer.Argument(help="the command to profile, after `--`")
    ] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="folder for run directories")] = (
        DEFAULT_RUNS_DIR
    ),
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="run name (default: the script's name)")
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", "-i", help="system sampling interval, 0.05-60 s")
    ] = default(profile_command, "interval"),
    headspace: Annotated[
        int,
        typer.Option(
            "--headspace",
            help="measure the job's own ceiling: after 10 warm-up steps, feed the next N steps "
            "one kept batch again and again (those steps train on a repeated batch); 0: off",
            min=0,
        ),
    ] = 0,
) -> None:
    """Run COMMAND under the profiler: `gpufeed profile -- python train.py`. Exit code is COMMAND's."""
    check_command(command or [])
    check_utf8("--name", name)
    code, _ = profile_command(
        command or [], out=out, name=name, interval=interval, headspace=headspace
    )
    raise typer.Exit(code)


RUNS_HELP = "a run directory; several (one per host of a multi-node job) are read as one run"


SETS_HELP = "override a threshold: RULE.param=value (repeatable)"
CONFIG_HELP = "thresholds file (default: ./gpufeed.toml)"


@app.command("show")
def show_cmd(
    runs: Annotated[list[str], typer.Argument(help=RUNS_HELP)],
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
    config: Annotated[str | None, typer.Option("--config", help=CONFIG_HELP)] = None,
) -> None:
    """Print a run's summary (phases, steps/s, data wait, percentiles of every metric) and findings."""
    from gpufeed.commands.show import show

    show(runs, config=config, sets=sets or ())


@app.command("ls")
def ls_cmd(
    out: Annotated[str, typer.Argument(help="folder holding run directories")] = DEFAULT_RUNS_DIR,
) -> None:
    """List the runs under a folder (default ./gpufeed-runs), latest start first."""
    import os

    from gpufeed.commands.ls import list_runs

    if not os.path.exists(out) and out != DEFAULT_RUNS_DIR:  # no default folder: no runs yet
        raise GpufeedError(
            f"{out}: no such folder; pass the folder given to `gpufeed profile --out` "
            f"(default ./{DEFAULT_RUNS_DIR})"
        )
    if os.path.exists(out) and not os.path.isdir(out):
        raise GpufeedError(f"{out} is a file, not a folder of runs: pass the folder given to --out")
    list_runs(out)


# --- UNDERSTAND/SHOW: report, trace, rules -------------------------------------------------------


@app.command("report")
def report_cmd(
    runs: Annotated[list[str], typer.Argument(help=RUNS_HELP)],
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="HTML file (default: RUN/report.html)")
    ] = None,
    json_out: Annotated[
        str | None, typer.Option("--json", help="also write the findings as JSON to this file")
    ] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
    config: Annotated[str | None, typer.Option("--config", help=CONFIG_HELP)] = None,
    watch: Annotated[
        float | None,
        typer.Option("--watch", help="rewrite every SECONDS until the run ends (Ctrl-C stops)"),
    ] = None,
) -> None:
    """Write a self-contained HTML report: summary, findings with evidence and fixes, charts."""
    from gpufeed.commands.report import write_report
    from gpufeed.present.terminal import findings_view

    if watch is not None and not 0 < watch < math.inf:
        raise GpufeedError(f"--watch {watch:g}: give the seconds between rewrites, e.g. --watch 10")
    check_output_file("--out", out, make_parents=True, example="report.html")
    check_output_file("--json", json_out, make_parents=True)
    check_distinct(("--out", out), ("--json", json_out))
    err = onto_stdout(out, json_out)
    try:
        write_report(
            runs,
            out,
            json_out,
            config=config,
            sets=sets or (),
            watch=watch,
            echo=say(err),
            on_findings=lambda findings: echo_result(findings_view(findings), err),
        )
    except OSError as e:
        raise GpufeedError(cannot_write(e, "--out", out, json_out)) from None


@app.command("trace")
def trace_cmd(
    runs: Annotated[list[str], typer.Argument(help=RUNS_HELP)],
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            help="JSON file (default: RUN/trace.json; with --merge, RUN/trace-merged.json)",
        ),
    ] = None,
    start: Annotated[
        float | None, typer.Option("--start", help="window start, seconds from the run's start")
    ] = None,
    end: Annotated[
        float | None, typer.Option("--end", help="window end, seconds from the run's start")
    ] = None,
    max_mb: Annotated[
        float, typer.Option("--max-mb", help="refuse traces larger than this many MB")
    ] = MAX_MB,
    merge: Annotated[
        str | None,
        typer.Option(
            "--merge",
            help="a torch.profiler (Kineto) trace: add gpufeed's tracks to it, aligned in time",
        ),
    ] = None,
) -> None:
    """Write a Chrome/Perfetto trace of a run (several RUNs, one per host, are read as one).

    Per rank: step spans split into data wait, forward, backward and optimizer; evaluation passes on a track of their own. System metric counters and CPU by process role. With --merge, these tracks are added to a torch.profiler trace, aligned in time.
    """
    from gpufeed.commands.trace import write_trace

    if not 0 < max_mb < math.inf:
        raise GpufeedError(
            f"--max-mb {max_mb:g}: give a size in MB above 0, e.g. --max-mb {MAX_MB:g}"
        )
    for option, value in (("--start", start), ("--end", end)):
        if value is not None and not 0 <= value < math.inf:
            raise GpufeedError(
                f"{option} {value:g}: give seconds from the run's start, 0 or more, "
                f"e.g. {option} 30"
            )
    check_output_file("--out", out, make_parents=True, example="trace.json")
    try:
        echo = say(onto_stdout(out))
        write_trace(runs, out, start=start, end=end, max_mb=max_mb, echo=echo, merge=merge)
    except OSError as e:
        raise GpufeedError(cannot_write(e, "--out", out)) from None


@app.command("export")
def export_cmd(
    runs: Annotated[list[str], typer.Argument(help=RUNS_HELP)],
    tensorboard: Annotated[
        str | None,
        typer.Option("--tensorboard", help="write TensorBoard event files into this folder"),
    ] = None,
) -> None:
    """Export a run for other tools: step time, data wait, throughput and system metrics."""
    from gpufeed.commands.export import export_tensorboard

    if tensorboard is None:
        raise GpufeedError("say what to export: --tensorboard DIR")
    check_utf8("--tensorboard", tensorboard)  # TensorBoard's writer fails on such a path
    check_output_dir("--tensorboard", tensorboard)
    try:
        export_tensorboard(runs, tensorboard, echo=typer.echo)
    except OSError as e:
        raise GpufeedError(f"cannot write {e.filename}: {e.strerror}") from None


@app.command("rules")
def rules_cmd() -> None:
    """List the bottleneck rules with their parameters and defaults."""
    from gpufeed.analysis.rules import describe

    typer.echo(describe())


# --- FEED: pack ----------------------------------------------------------------------------------


@app.command("pack")
def pack_cmd(
    src: Annotated[
        str,
        typer.Argument(
            help="Image folder (SRC/<class>/<image>) or list file (PATH LABEL per line; tab, comma or spaces between, the label last)."
        ),
    ],
    dst: Annotated[str, typer.Argument(help="Output directory or s3://bucket/prefix.")],
    shard_size: Annotated[
        str,
        typer.Option("--shard-size", help="Target bytes per shard (1-128 MB is the useful range)."),
    ] = default(pack, "shard_size"),
    resize: Annotated[
        int | None,
        typer.Option(
            "--resize", help="Pre-resize to this short side (and re-encode at --quality)."
        ),
    ] = default(pack, "resize"),
    quality: Annotated[
        int, typer.Option("--quality", help="JPEG quality for re-encoded images.")
    ] = default(pack, "quality"),
    workers: Annotated[
        int | None, typer.Option("--workers", help="Worker processes (default: the usable cores).")
    ] = default(pack, "workers"),
    verify: Annotated[
        bool, typer.Option("--verify", help="Decode every image; skip the ones that fail.")
    ] = default(pack, "verify"),
    seed: Annotated[
        int, typer.Option("--seed", help="Seed for the sample order across shards.")
    ] = default(pack, "seed"),
    timeout: Annotated[float | None, typer.Option("--timeout", help=TIMEOUT_HELP)] = None,
) -> None:
    """Pack images into tar shards (WebDataset layout) plus gpufeed-index.json, locally or on S3."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("default")  # each distinct warning once per process, not per image
        warnings.showwarning = _warn_now
        result = pack(
            src, dst, shard_size=shard_size, resize=resize, quality=quality,
            workers=workers, verify=verify, seed=seed, storage_options=remote_options(timeout),
        )  # fmt: skip
    typer.echo(result.summary())


def _warn_now(message: Warning | str, *_: object, **__: object) -> None:
    """Print a warning of `pack` when it happens (an unreadable folder is worth stopping a long
    pack for), as `gpufeed: warning: ...` on stderr; into `sys.stderr` as it is now, which the
    progress bar replaces while it runs to print such lines above itself."""
    import contextlib
    import sys

    with contextlib.suppress(OSError):  # stderr gone (a closed pipe): the pack goes on
        typer.secho(
            f"gpufeed: warning: {visible(message)}", file=sys.stderr, fg=typer.colors.YELLOW
        )


@app.command("index")
def index_cmd(
    shards: Annotated[
        list[str],
        typer.Argument(
            help="WebDataset shards: paths, s3:// URLs, brace patterns (x-{000..099}.tar)"
        ),
    ],
    classes: Annotated[
        str | None,
        typer.Option(
            "--classes",
            help="class names by id: a text file (one a line), a JSON list or {name: id}",
        ),
    ] = None,
    label_field: Annotated[
        str | None,
        typer.Option(
            "--label-field", help="the .json field holding the label (default: cls, label, class)"
        ),
    ] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help=TIMEOUT_HELP)] = None,
) -> None:
    """Index existing WebDataset tar shards in one pass, so `Loader` reads them (writes gpufeed-index.json next to them)."""
    from gpufeed.data.indexer import index_shards

    result = index_shards(
        shards, classes=classes, label_field=label_field, storage_options=remote_options(timeout)
    )
    typer.echo(result.summary())


# --- EVIDENCE: bench, diagnose, tune, demo -------------------------------------------------------


@app.command("bench")
def bench_cmd(
    name: Annotated[
        str,
        typer.Argument(
            help="augload (CPU vs GPU preprocessing × augmentation load × model), "
            "workers (1 vs cores-1 loader workers, resized vs not), batch (small vs large batch).",
        ),
    ],
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="Results directory (default ./gpufeed-runs/bench-NAME)."),
    ] = None,
    full: Annotated[
        bool | None,
        typer.Option(
            "--full/--reduced",
            help="Full GPU grid or the reduced CPU grid (default: full iff CUDA).",
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data", help="Your image folder (class/image.jpg) instead of the generated one."
        ),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option("--budget", help="Stop starting new configurations after this many seconds."),
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Steps per configuration.")] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats", help="augload: interleaved repeats of the grid (medians reported)."
        ),
    ] = None,
    images: Annotated[int | None, typer.Option("--images", help="Images to generate.")] = None,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Batch size (augload, workers).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Loader workers, 1 or more (default cores-1); for `workers` the count "
            "compared with 1 worker, 2 or more.",
        ),
    ] = None,
    cache: Annotated[
        str | None,
        typer.Option(
            "--cache",
            help="Where generated images and shards are kept (./.gpufeed-cache/bench).",
        ),
    ] = None,
) -> None:
    """Run an experiment; write results.csv/.json/.md and results.png with the hardware.

    Experiments: augload, workers, batch. Partial results are written after every configuration.
    """
    import warnings

    from gpufeed.bench.experiments import run_bench

    check_seconds("--budget", budget)
    for option, value in (("--steps", steps), ("--repeats", repeats), ("--images", images)):
        check_count(option, value, 1)
    check_count("--batch-size", batch_size, 1)
    check_count("--workers", workers, 1)  # as `default_config` requires

    with warnings.catch_warnings(record=True) as caught:  # e.g. files of --data skipped, no chart
        path = run_bench(
            name, out, full=full, data=data, budget_s=budget, steps=steps, repeats=repeats,
            images=images, batch_size=batch_size, workers=workers, cache=cache,
        )  # fmt: skip
    # not Python's own notices (3.12 warns of os.fork beside threads, as for any DataLoader)
    ours = (w for w in caught if not issubclass(w.category, DeprecationWarning))
    for message in dict.fromkeys(str(w.message) for w in ours):
        typer.secho(f"gpufeed: warning: {visible(message)}", err=True, fg=typer.colors.YELLOW)
    chart = ", .png" if (path / "results.png").is_file() else ""
    typer.echo(f"gpufeed: wrote {visible(path)}/results.md (+ .csv, .json{chart})")


# demo, diagnose, tune (the main job)


DEMO = DemoConfig()


@app.command("demo")
def demo_cmd(
    tiny: Annotated[
        bool, typer.Option("--tiny", help="A few hundred images, seconds (what CI runs).")
    ] = False,
    images: Annotated[
        int | None,
        typer.Option("--images", help=f"Images to generate (default {DEMO.images})."),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option("--steps", help=f"Training steps per run (default {DEMO.steps})."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help=f"{DEMO.model} (default), resnet50, ..."),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", help=f"Batch size (default {DEMO.batch_size})."),
    ] = None,
    image_size: Annotated[
        int | None,
        typer.Option(
            "--image-size",
            help=f"Training image size (default {DEMO.image_size} on CPU, {GPU_IMAGE_SIZE} with a GPU).",
        ),
    ] = None,
    out: Annotated[
        str, typer.Option("--out", "-o", help="Work dir; data is cached here.")
    ] = DEFAULT_WORK_DIR,
) -> None:
    """Profile a naive training pipeline, show its bottleneck, then fix it with the gpufeed loader."""
    from gpufeed.demo.compare import demo_config, run_demo

    check_utf8("--out", out)
    check_output_dir("--out", out)
    echo_result(run_demo(demo_config(tiny, images, steps, model, batch_size, image_size), out))


@app.command("diagnose")
def diagnose_cmd(
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="Image folder, shard directory, or module:function returning a loader.",
        ),
    ],
    model: Annotated[
        str, typer.Option("--model", help="resnet18, resnet50, resnet152 or module:function.")
    ] = default(diagnose, "model"),
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Batch size (folder and shards).")
    ] = default(diagnose, "batch_size"),
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda (default: cuda if any).")
    ] = default(diagnose, "device"),
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Loader workers for a folder or shards (default: on CUDA every core but one, "
            "as the Loader; on a CPU device half the cores, which also train).",
        ),
    ] = default(diagnose, "workers"),
    image_size: Annotated[int, typer.Option("--image-size", help="Training image size.")] = default(
        diagnose, "image_size"
    ),
    seconds: Annotated[float, typer.Option("--seconds", help="Seconds per measurement.")] = default(
        diagnose, "seconds"
    ),
    precision: Annotated[
        str,
        typer.Option(
            "--precision", help="bf16, fp16 or fp32 autocast (default: bf16 on CUDA, else fp32)."
        ),
    ] = default(diagnose, "precision"),
    channels_last: Annotated[
        bool | None,
        typer.Option(
            "--channels-last/--no-channels-last", help="Memory format (default: on with CUDA)."
        ),
    ] = default(diagnose, "channels_last"),
    compile: Annotated[
        bool, typer.Option("--compile", help="torch.compile the model, as the job does.")
    ] = default(diagnose, "compile"),
    augment_load: Annotated[
        int,
        typer.Option("--augment-load", help=AUGMENT_LOAD_HELP + " Folder and shards only."),
    ] = default(diagnose, "augment_load"),
    json_out: Annotated[
        str | None,
        typer.Option("--json", help="Also write the diagnosis as JSON to this file (for CI)."),
    ] = None,
) -> None:
    """Input-bound or compute-bound? Measure the loader alone, the model alone and both together."""
    check_seconds("--seconds", seconds)
    check_count("--workers", workers, 0)
    check_count("--batch-size", batch_size, 1)
    check_count("--image-size", image_size, 1)
    check_count("--augment-load", augment_load, 0, MOST_AUGMENT_LOAD)
    check_output_file("--json", json_out)

    result = diagnose(
        data,
        model,
        batch_size,
        device,
        workers,
        image_size,
        seconds,
        precision=precision,
        channels_last=channels_last,
        compile=compile,
        augment_load=augment_load,
    )
    echo_result(result, onto_stdout(json_out))
    if json_out:
        from gpufeed.atomic import write_atomic
        from gpufeed.present.html import strict_json

        try:
            write_atomic(json_out, strict_json(result.to_dict(), indent=2) + "\n")
        except OSError as e:
            raise GpufeedError(f"cannot write {written(e, json_out)}: {e.strerror}") from None


@app.command("tune")
def tune_cmd(
    data: Annotated[str, typer.Option("--data", help="Shard directory (or an image folder).")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Stop once the loader outruns this model (name or module:function)."
        ),
    ] = default(tune, "model"),
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size.")] = default(
        tune, "batch_size"
    ),
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda (default: cuda if any).")
    ] = default(tune, "device"),
    image_size: Annotated[int, typer.Option("--image-size", help="Training image size.")] = default(
        tune, "image_size"
    ),
    allow_batch_change: Annotated[
        bool,
        typer.Option("--allow-batch-change", help="Also try half and double the batch size."),
    ] = default(tune, "allow_batch_change"),
    out: Annotated[str, typer.Option("--out", "-o", help="Where to write the winner.")] = default(
        tune, "out"
    ),
    seconds: Annotated[float, typer.Option("--seconds", help="Seconds per measurement.")] = default(
        tune, "seconds"
    ),
    repeats: Annotated[
        int, typer.Option("--repeats", help="Measurements per trial (median, spread).")
    ] = default(tune, "repeats"),
    augment_load: Annotated[int, typer.Option("--augment-load", help=AUGMENT_LOAD_HELP)] = default(
        tune, "augment_load"
    ),
) -> None:
    """Search loader workers, prefetch, CPU/GPU preprocessing (and batch size) by measured trials."""
    check_seconds("--seconds", seconds)
    check_count("--batch-size", batch_size, 1)
    check_count("--image-size", image_size, 1)
    check_count("--augment-load", augment_load, 0, MOST_AUGMENT_LOAD)
    check_output_file("--out", out, example="gpufeed-tune.json")

    result = tune(
        data,
        model,
        batch_size,
        device,
        image_size,
        allow_batch_change,
        out,
        seconds,
        repeats=repeats,
        augment_load=augment_load,
    )
    echo_result(result, onto_stdout(out))


def main() -> None:
    """Console-script entry point; `Commands` turns every GpufeedError into a one-line error, and
    a warning (a store file of a run left out) reads `gpufeed: warning: ...`, not a source line."""
    import warnings

    warnings.showwarning = _warn_now
    app()


if __name__ == "__main__":
    main()
