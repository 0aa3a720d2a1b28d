"""The one error type of gpufeed: every error a user can act on derives from `GpufeedError`, so the
command line turns any of them into one `gpufeed: error: MESSAGE` line and its exit code."""

from __future__ import annotations

from gpufeed.text import visible


class GpufeedError(Exception):
    """An error whose message says what is wrong and what to do; `exit_code` is the CLI's (2)."""

    exit_code: int = 2

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        # Messages name keys, shards, paths and URLs from the data: no terminal control reaches a
        # user through them.
        super().__init__(visible(message, keep_newlines=True))
        if exit_code is not None:
            self.exit_code = exit_code


class OptionError(GpufeedError, ValueError):
    """An option of the Loader, its ShardDataset or Augment that cannot work as given (the
    message names it and says what to pass instead)."""
