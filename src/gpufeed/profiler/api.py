"""In-code API: `with gpufeed.profile(...):` profiles the code inside; `gpufeed.step()` marks a step.

Under `gpufeed profile -- ...` the process is already profiled and `profile()` changes nothing.
Otherwise it creates a run directory, starts the system sampler as a child process (which exits when
this process dies) and installs the same hooks the zero-code path uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from gpufeed.profiler.session import DEFAULT_INTERVAL, ENV_RUN_DIR


def step(samples: float | None = None) -> None:
    """Mark the end of a training step (for loops without a torch optimizer); no-op when not profiling."""
    from gpufeed.profiler import autopatch

    try:
        rec = autopatch.recorder()
        if rec is not None:
            rec.mark_step(samples)
    except Exception as e:  # the profiler never raises into the training loop
        autopatch.hook_failed(e)


class profile:
    """Profile the code inside `with`, or between `start()` and `stop()`; `run_dir` is where it goes."""

    def __init__(
        self,
        out: str | os.PathLike[str] | None = None,
        name: str | None = None,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        from gpufeed.profiler.session import check_interval

        self.out, self.name, self.interval = out, name, check_interval(interval)
        self.run_dir: Path | None = None
        self._sampler: subprocess.Popen | None = None
        self._owner = False

    def start(self) -> profile:
        """Begin profiling; returns self."""
        from gpufeed.profiler import autopatch
        from gpufeed.profiler.redact import redact_argv, redact_env
        from gpufeed.profiler.session import (
            ProfileError,
            create_run_dir,
            hostname,
            machine_meta,
            run_name,
            save_meta,
            system_store_path,
            warn_once,
        )

        existing = os.environ.get(ENV_RUN_DIR)
        if existing:  # launched by `gpufeed profile`: already recording
            self.run_dir = Path(existing)
            return self
        argv = [sys.executable, *sys.argv]
        name = self.name or run_name(argv)
        try:
            self.run_dir = create_run_dir(self.out, name).resolve()
        except ProfileError as e:  # storage never stops the training: it runs unprofiled
            warn_once("run-dir", f"{e}; running without profiling")
            return self
        save_meta(
            self.run_dir,
            name=name,
            command=redact_argv(argv),
            env=redact_env(os.environ),
            cwd=os.getcwd(),
            start_time=time.time(),
            end_time=None,
            exit_code=None,
            interval=self.interval,
            **machine_meta(),
        )
        self._owner = True
        os.environ[ENV_RUN_DIR] = str(self.run_dir)
        try:
            self._sampler = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpufeed.profiler.sampler",
                    str(self.run_dir),
                    "--root-pid",
                    str(os.getpid()),
                    "--interval",
                    str(self.interval),
                ],
                stdin=subprocess.DEVNULL,
            )
        except OSError as e:  # without a sampler the steps are still worth having
            warn_once(str(self.run_dir), f"system sampler not started: {e}")
        else:
            _wait_for(system_store_path(self.run_dir, hostname()), self._sampler, timeout=10.0)
        autopatch.reset()
        autopatch.install()
        rec = autopatch.recorder()
        if rec is not None:
            rec.begin()
        return self

    def stop(self, exit_code: int = 0) -> None:
        """End profiling: write the remaining steps, stop the sampler, finish meta.json."""
        if not self._owner:
            return
        from gpufeed.profiler import autopatch
        from gpufeed.profiler.session import save_meta

        self._owner = False
        autopatch.close()
        autopatch.uninstall()
        os.environ.pop(ENV_RUN_DIR, None)
        autopatch.reset()
        if self._sampler is not None:
            self._sampler.terminate()
            try:
                self._sampler.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._sampler.kill()
                self._sampler.wait()
        save_meta(self.run_dir, end_time=time.time(), exit_code=exit_code)  # type: ignore[arg-type]

    def __enter__(self) -> profile:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(exit_code=exit_code_of(exc))


def exit_code_of(exc: BaseException | None) -> int:
    """The exit code a Python process ending with `exc` has: 0 without one, `sys.exit`'s code,
    130 for Ctrl-C (as a shell reports it), else 1."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        return 0 if code is None else code if isinstance(code, int) else 1
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _wait_for(path: Path, sampler: subprocess.Popen, timeout: float) -> None:
    """Wait until the sampler has created its store, so that sampling covers the profiled code."""
    deadline = time.monotonic() + timeout
    while not path.exists() and sampler.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
