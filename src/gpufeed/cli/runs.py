"""The commands about runs: `profile` makes one; `show`, `ls`, `report`, `trace`, `export` read
them and `rules` lists what they are checked against. Each checks its options and calls one
function of `profiler/`, `commands/` or `analysis/`; `gpufeed.cli` registers them on the app.
"""

from __future__ import annotations

import math
from typing import Annotated

import typer

from gpufeed.cli.options import (
    CONFIG_HELP,
    DEFAULT_RUNS_DIR,
    RUNS_HELP,
    SETS_HELP,
    cannot_write,
    check_utf8,
    default,
    echo_result,
    onto_stdout,
    say,
)
from gpufeed.errors import GpufeedError
from gpufeed.output_paths import check_distinct, check_output_dir, check_output_file
from gpufeed.present.trace import MAX_MB
from gpufeed.profiler.launch import profile_command

# `gpufeed profile [OPTIONS] -- COMMAND ...`: options after COMMAND's first word are COMMAND's
PROFILE_SETTINGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}


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


def show_cmd(
    runs: Annotated[list[str], typer.Argument(help=RUNS_HELP)],
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
    config: Annotated[str | None, typer.Option("--config", help=CONFIG_HELP)] = None,
) -> None:
    """Print a run's summary (phases, steps/s, data wait, percentiles of every metric) and findings."""
    from gpufeed.commands.show import show

    show(runs, config=config, sets=sets or ())


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


def rules_cmd() -> None:
    """List the bottleneck rules with their parameters and defaults."""
    from gpufeed.analysis.rules import describe

    typer.echo(describe())
