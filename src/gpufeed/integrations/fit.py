"""What every trainer callback does: profile from the fit's start to its end, then write the report."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from gpufeed.profile.session import DEFAULT_INTERVAL


class FitProfiler:
    """`start()` when the fit begins, `finish(failed)` when it ends; the report lands in the run dir."""

    def __init__(
        self,
        out: str | os.PathLike[str] | None = None,
        name: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        report: bool = True,
        echo: Callable[[str], None] = print,
    ) -> None:
        from gpufeed.profile.api import profile

        self._profile = profile(out=out, name=name, interval=interval)  # checks the interval now
        self.report_enabled, self.echo = report, echo
        self.run_dir: Path | None = None
        self.report: Path | None = None

    def start(self) -> None:
        """Begin profiling (under `gpufeed profile` the running session goes on recording)."""
        self.run_dir = self._profile.start().run_dir

    def finish(self, failed: bool = False, write_report: bool = True) -> Path | None:
        """Stop profiling and, on the process that should, write RUN/report.html; returns its path."""
        from gpufeed.present.html import write_report as write

        self._profile.stop(exit_code=1 if failed else 0)
        if not (self.report_enabled and write_report and self.run_dir is not None):
            return None
        try:
            self.report = write(self.run_dir, echo=self.echo)
        except Exception as e:  # a report that cannot be written never fails the training
            self.echo(f"gpufeed: warning: no report for {self.run_dir}: {e}")
        return self.report
