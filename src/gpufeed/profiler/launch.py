"""`gpufeed profile -- CMD`: validate, create the run directory, sample, run CMD with the bootstrap.

The parent stays alive for the whole command: it samples the system in a thread, forwards signals
it receives from other processes (the terminal already delivers Ctrl-C to the child, which shares
its process group), passes the command's exit code through and finishes meta.json.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gpufeed.profiler.redact import redact_argv, redact_env
from gpufeed.profiler.sampler import Sampler
from gpufeed.profiler.session import (
    DEFAULT_INTERVAL,
    ENV_HEADSPACE,
    ENV_RUN_DIR,
    ProfileError,
    check_headspace,
    check_interval,
    create_run_dir,
    machine_meta,
    run_name,
    save_meta,
    warn_once,
    warned,
)

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
_FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_SI_KERNEL = 0x80  # siginfo code of signals the kernel sends itself, e.g. from the terminal


def resolve_command(command: list[str]) -> str:
    """The executable COMMAND[0] names, or a ProfileError (exit 127, as a shell would) if none."""
    if not command:
        raise ProfileError("no command to profile: use `gpufeed profile [OPTIONS] -- COMMAND ...`")
    prog = command[0]
    path = shutil.which(prog)
    if path is None:
        where = "file" if os.sep in prog else "command on PATH"
        raise ProfileError(
            f"{prog!r}: no such executable {where}; check the command", exit_code=127
        )
    return path


def child_env(run_dir: Path, headspace: int = 0) -> dict[str, str]:
    """The command's environment: the bootstrap first on PYTHONPATH, the run directory named, and
    the steps to replay where `--headspace` asks for some."""
    env = dict(os.environ)
    env.pop(ENV_HEADSPACE, None)
    if headspace:
        env[ENV_HEADSPACE] = str(headspace)
    given = env.get("PYTHONPATH")  # kept as it is: an empty entry ("":/opt/libs) is the cwd
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + given if given else "")
    env[ENV_RUN_DIR] = str(run_dir.resolve())
    env["GPUFEED_PKG_PARENT"] = str(Path(__file__).resolve().parents[2])
    return env


def _spawn_failure(executable: str, error: OSError) -> str:
    """Why an existing file could not be run: a script whose #! interpreter is missing (or ends
    in a carriage return: CRLF line endings) reads as 'No such file or directory' otherwise."""
    why = error.strerror or str(error)
    try:
        with open(executable, "rb") as f:
            first = f.readline(512)
    except OSError:
        return why
    if not first.startswith(b"#!"):
        if error.errno == errno.ENOEXEC:
            return f"{why}: not a program and no #! line; run it with its interpreter"
        return why
    interpreter = first[2:].rstrip(b"\n").decode("utf-8", "replace")
    if interpreter.endswith("\r"):
        return (
            f"its #! line ends in a carriage return ({interpreter.strip()!r} + '\\r'): the file "
            "has Windows (CRLF) line endings; convert it (dos2unix) or run it with its interpreter"
        )
    if error.errno == errno.ENOENT:
        return (
            f"its #! interpreter {interpreter.strip()!r} is not found; install it or fix the line"
        )
    return why


def profile_command(
    command: list[str],
    out: str | os.PathLike[str] | None = None,
    name: str | None = None,
    interval: float = DEFAULT_INTERVAL,
    headspace: int = 0,
) -> tuple[int, Path | None]:
    """Run `command` under the profiler; return (its exit code, the run directory). `headspace`:
    training steps after warm-up fed one kept batch, to measure the job's own ceiling (0: none).

    Raises ProfileError before anything starts if the command or interval is bad. Storage never
    stops the command nor changes its exit code: if the run directory cannot be created the command
    runs unprofiled (run directory None); if it cannot be written, what can be is recorded. Either
    way one warning is printed per process.
    """
    interval = check_interval(interval)
    headspace = check_headspace(headspace)
    executable = resolve_command(command)
    name = name or run_name(command)
    run_dir: Path | None
    try:
        run_dir = create_run_dir(out, name)
    except ProfileError as e:
        warn_once("run-dir", f"{e}; the command runs without profiling")
        run_dir = None
    meta: dict[str, Any] = {}
    if run_dir is not None:
        _say(f"gpufeed: profiling into {run_dir}")
        meta = _initial_meta(command, name, interval)
        if headspace:
            meta["headspace"] = headspace
        save_meta(run_dir, **meta)

    # Signals are blocked from here on and taken by sigtimedwait() (the sampler thread inherits
    # the block); the child is spawned with an empty mask.
    signal.pthread_sigmask(signal.SIG_BLOCK, [*_FORWARDED, signal.SIGCHLD])
    try:
        try:
            pid = os.posix_spawn(
                executable,
                command,
                child_env(run_dir, headspace) if run_dir is not None else dict(os.environ),
                setsigmask=(),
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except OSError as e:
            code = 127 if e.errno == errno.ENOENT else 126  # as a shell: not found, not runnable
            if run_dir is not None:
                save_meta(
                    run_dir, **{**meta, "end_time": time.time(), "exit_code": code, "error": str(e)}
                )
            raise ProfileError(
                f"cannot run {command[0]!r}: {_spawn_failure(executable, e)}", exit_code=code
            ) from None
        sampler = None
        if run_dir is not None:
            try:
                sampler = Sampler(run_dir, pid, interval)
                sampler.start()
            except Exception as e:  # without a sampler the steps are still worth having
                warn_once(str(run_dir), f"system sampler not started: {e}")
        code = _wait_forwarding(pid)
        if sampler is not None:
            try:
                sampler.stop()
            except Exception as e:
                warn_once(str(run_dir), f"system sampler did not stop cleanly: {e}")
        if run_dir is not None:
            save_meta(run_dir, **{**meta, "end_time": time.time(), "exit_code": code})
    finally:
        # A Ctrl-C that reached the child after our last wait must not kill us once unblocked.
        while signal.sigtimedwait([*_FORWARDED, signal.SIGCHLD], 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [*_FORWARDED, signal.SIGCHLD])
    if run_dir is None:
        _say(f"gpufeed: the command ran unprofiled (exit code {code})")
    elif warned(str(run_dir)):
        _say(
            f"gpufeed: run in {run_dir} is incomplete: it could not all be written (exit code {code})"
        )
    else:
        _say(f"gpufeed: run written to {run_dir} (exit code {code})")
    return code, run_dir


def _initial_meta(command: list[str], name: str, interval: float) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "start_time": time.time(), "end_time": None}
    meta.update(exit_code=None, interval=interval)
    try:
        meta.update(command=redact_argv(command), env=redact_env(os.environ), cwd=os.getcwd())
    except Exception as e:  # nothing unredacted is written; the run goes on
        meta["meta_error"] = f"command and environment not recorded: {e}"
    try:
        meta.update(machine_meta())
    except Exception as e:
        meta["meta_error"] = f"machine facts not recorded: {e}"
    return meta


def _say(line: str) -> None:
    # The command's exit code must pass through even where our stderr is closed.
    with contextlib.suppress(Exception):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _wait_forwarding(pid: int) -> int:
    """Wait for the child, forwarding signals sent to us; its exit code (128+N if killed by signal N)."""
    wanted = {*_FORWARDED, signal.SIGCHLD}
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
        info = signal.sigtimedwait(wanted, 1.0)
        if info is None or info.si_signo == signal.SIGCHLD or info.si_code == _SI_KERNEL:
            continue  # a terminal's signal already reached the child, in our process group
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, info.si_signo)
