"""Thin command line: every command parses its options and calls one function in a module below.

Implementation modules are imported inside each command so that `gpufeed --help` stays instant.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gpufeed",
    help="Find out why GPU training is slow, and keep the GPU fed.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error in red to stderr and return the Exit to raise."""
    typer.secho(f"gpufeed: error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


# --- COLLECT: profile, show, ls ---------------------------------------------------------------

# --- UNDERSTAND/SHOW: report, trace, rules -------------------------------------------------------

# --- FEED: pack ----------------------------------------------------------------------------------

# --- EVIDENCE: bench, diagnose, tune, demo -------------------------------------------------------


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
