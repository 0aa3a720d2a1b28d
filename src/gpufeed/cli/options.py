"""What the commands share: the error handler, option checks and their wording, help strings, and
how a command prints what it returns; one place, so that every command says a thing the same way.

Options default to the library's own defaults (read from the function signatures, never restated).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import click
import typer
from typer.core import TyperGroup

from gpufeed.data.packing import printable
from gpufeed.data.storage import DEFAULT_TIMEOUT
from gpufeed.errors import GpufeedError
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


def warn_now(message: Warning | str, *_: object, **__: object) -> None:
    """Print a warning when it happens (an unreadable folder is worth stopping a long pack for),
    as `gpufeed: warning: ...` on stderr; into `sys.stderr` as it is now, which a progress bar
    replaces while it runs to print such lines above itself."""
    import contextlib
    import sys

    with contextlib.suppress(OSError):  # stderr gone (a closed pipe): the command goes on
        typer.secho(
            f"gpufeed: warning: {visible(message)}", file=sys.stderr, fg=typer.colors.YELLOW
        )


def check_seconds(option: str, value: float | None) -> None:
    """Refuse a duration that is not a finite number of seconds above 0."""
    if value is not None and not 0 < value < math.inf:
        raise GpufeedError(f"{option} {value:g}: give a number of seconds above 0, e.g. {option} 4")


def check_count(option: str, value: int | None, least: int, most: int | None = None) -> None:
    """Refuse a count below `least` (or above `most`)."""
    if value is not None and value < least:
        raise GpufeedError(f"{option} {value}: must be {least} or more")
    if value is not None and most is not None and value > most:
        raise GpufeedError(f"{option} {value}: must be {most} or less")


TIMEOUT_HELP = (
    f"Seconds one s3:// read or write may take, retries included (default {DEFAULT_TIMEOUT:g})."
)


def remote_options(timeout: float | None) -> dict[str, float] | None:
    """The storage_options of a command's `--timeout` (None: the default deadline)."""
    check_seconds("--timeout", timeout)
    return None if timeout is None else {"timeout": timeout}


AUGMENT_LOAD_HELP = (
    "Augmentation of the images measured: 0 = the ImageNet recipe (random-resized crop, flip); "
    "L = that plus L x (flips, rotation up to ±15°), each rotation one more resampling."
)
MOST_AUGMENT_LOAD = 64  # 64 resamplings per image: far beyond any recipe, and still minutes

DEFAULT_RUNS_DIR = "gpufeed-runs"
RUNS_HELP = "a run directory; several (one per host of a multi-node job) are read as one run"
SETS_HELP = "override a threshold: RULE.param=value (repeatable)"
CONFIG_HELP = "thresholds file (default: ./gpufeed.toml)"
