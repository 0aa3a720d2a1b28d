"""Thin command line: every command parses its options and calls one function in a module below.

The commands live by what they are about (`runs`: profile and the run readers; `feed`: pack and
index; `advise`: bench, demo, diagnose, tune; `options`: the checks and wording they share) and are
registered here, in the order `gpufeed --help` lists them. Options default to the library's own
defaults (read from the function signatures, never restated). The heavy parts (torch, pandas) are
imported inside each command so that `gpufeed --help` stays fast.
"""

from __future__ import annotations

import typer

from gpufeed.cli.advise import bench_cmd, demo_cmd, diagnose_cmd, tune_cmd
from gpufeed.cli.feed import index_cmd, pack_cmd
from gpufeed.cli.options import Commands, echo_result, warn_now
from gpufeed.cli.runs import (
    PROFILE_SETTINGS,
    export_cmd,
    ls_cmd,
    profile_cmd,
    report_cmd,
    rules_cmd,
    show_cmd,
    trace_cmd,
)

__all__ = ["app", "echo_result", "main"]

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

# COLLECT, UNDERSTAND and SHOW
app.command("profile", context_settings=PROFILE_SETTINGS)(profile_cmd)
app.command("show")(show_cmd)
app.command("ls")(ls_cmd)
app.command("report")(report_cmd)
app.command("trace")(trace_cmd)
app.command("export")(export_cmd)
app.command("rules")(rules_cmd)
# FEED
app.command("pack")(pack_cmd)
app.command("index")(index_cmd)
# EVIDENCE and ADVICE
app.command("bench")(bench_cmd)
app.command("demo")(demo_cmd)
app.command("diagnose")(diagnose_cmd)
app.command("tune")(tune_cmd)


def main() -> None:
    """Console-script entry point; `Commands` turns every GpufeedError into a one-line error, and
    a warning (a store file of a run left out) reads `gpufeed: warning: ...`, not a source line."""
    import warnings

    warnings.showwarning = warn_now
    app()
