"""What every trainer callback does: profile from the fit's start to its end, then write the report."""

from __future__ import annotations

import os
from pathlib import Path

from gpufeed.profiler.session import DEFAULT_INTERVAL


class ProfiledFit:
    """Mixin of the trainer callbacks: their options, `run_dir`, `report`, and the begin/end steps."""

    def __init__(
        self,
        out: str | os.PathLike[str] | None = None,
        name: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        report: bool = True,
    ) -> None:
        from gpufeed.profiler.api import profile

        self._profile = profile(out=out, name=name, interval=interval)  # checks the interval now
        self._write_report = report
        self.run_dir: Path | None = None  # set when the fit starts
        self.report: Path | None = None  # set when the report was written at the fit's end

    def _begin(self) -> None:
        """Begin profiling (under `gpufeed profile` the running session goes on recording)."""
        self.run_dir = self._profile.start().run_dir

    def _end(self, failed: bool = False, write_report: bool = True) -> None:
        """Stop profiling and, on the process that should, write RUN/report.html."""
        from gpufeed.commands.report import write_report as write

        self._profile.stop(exit_code=1 if failed else 0)
        if not (self._write_report and write_report and self.run_dir is not None):
            return
        try:
            self.report = write(self.run_dir)
        except Exception as e:  # a report that cannot be written never fails the training
            print(f"gpufeed: warning: no report for {self.run_dir}: {e}")
