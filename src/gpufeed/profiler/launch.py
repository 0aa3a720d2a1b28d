"""`gpufeed profile -- CMD`: validate, create the run directory, sample, run CMD with the bootstrap.

The parent stays alive for the whole command: it samples the system in a thread, passes on the
signals meant for the command, passes the command's exit code through and finishes meta.json.

Signals. The command stays in our process group, so that the terminal's Ctrl-C and Ctrl-Z and
`kill -- -PGID` (`kill %1`, Slurm's proctrack/pgid, a SIGKILL of the whole job) reach it as they
would without gpufeed. A signal that reached the whole group must not be passed on again (a second
SIGINT interrupts the command's own clean-up); one sent to our pid alone must be. siginfo cannot
tell them apart (kill() and killpg() both give SI_USER and the sender's pid), so a watcher process
in our group (`_GroupWatch`), which nobody signals on its own, reports each signal it gets: one it
got too went to the group, from the terminal or a kill, or to every process of the job (Slurm's
cgroup tracking, systemd), and the command has it already. A command that left our group (a
session of its own) is sent everything. SIGTSTP stops the command too, then us where a job-control
shell waits on us; SIGCONT is passed on like the others. Signals are caught, never blocked and
sigwaited: a library's native thread does not block them (it would die of one), and
sigtimedwait() returns an uninitialized record when a stop outlasts its timeout (CPython 3.11).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
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
_JOB_CONTROL = (signal.SIGTSTP, signal.SIGCONT)
_WAITED = (*_FORWARDED, *_JOB_CONTROL, signal.SIGCHLD)
# How long the watcher has to report a signal sent to the whole group (it is usually there within
# a millisecond); a signal sent to our pid alone is passed on this much later.
GROUP_WINDOW = 0.5
_STALE = 2.0  # seconds after which a report nothing matched (coalesced signals) is dropped


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

    # From here on the signals we pass on are caught, each delivery a byte on a pipe (`_Caught`).
    # Not blocked and sigwaited: a native thread a library started at import does not block them,
    # and we would die of one it took while our main thread was not waiting.
    signals = _Caught()
    watch = _GroupWatch.start(command)
    try:
        try:
            with signals.spawning():
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
        code = _wait_forwarding(pid, signals, watch)
        if sampler is not None:
            try:
                sampler.stop()
            except Exception as e:
                warn_once(str(run_dir), f"system sampler did not stop cleanly: {e}")
        if run_dir is not None:
            save_meta(run_dir, **{**meta, "end_time": time.time(), "exit_code": code})
    finally:
        if watch is not None:
            watch.close()
        signals.close()
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


def _ignore(signum: int, frame: Any) -> None:
    """The handler of the signals we catch: the wakeup pipe already has the delivery."""


class _Caught:
    """Catches the signals we pass on, the job-control ones and SIGCHLD from now until `close()`:
    the C-level handler writes a byte per delivery to a pipe (signal.set_wakeup_fd), in whichever
    thread the kernel picked. One ignored when we started (`nohup`'s SIGHUP, SIGINT of a script's
    background job) is passed on too, but the command starts with it ignored (`spawning()`), as
    it would without us. Off the main thread nothing is caught and `wait()` only sleeps."""

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}
        self._old_fd = -1
        self._r = self._w = -1
        if threading.current_thread() is not threading.main_thread():
            return
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        for sig in _WAITED:
            old = signal.signal(sig, _ignore)
            self._old[sig] = signal.SIG_DFL if old is None else old

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Around a spawn: the signals ignored when we started are ignored again (an exec keeps
        SIG_IGN, and resets what we catch to the default). Not SIGCHLD: ignored, it would have
        the kernel reap the command's children before the command can wait for them."""
        ignored = [s for s, old in self._old.items() if old == signal.SIG_IGN]
        ignored = [s for s in ignored if s != signal.SIGCHLD]
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)
        try:
            yield
        finally:
            for sig in ignored:
                signal.signal(sig, _ignore)

    def wait(self, timeout: float) -> list[int]:
        """The signals delivered since the last call, waiting up to `timeout` s for one."""
        if self._r < 0:
            time.sleep(timeout)
            return []
        select.select([self._r], [], [], timeout)
        try:
            return list(os.read(self._r, 1024))
        except BlockingIOError:
            return []

    def close(self) -> None:
        """Put the handlers and the wakeup fd back as they were."""
        for sig, old in self._old.items():
            with contextlib.suppress(Exception):
                signal.signal(sig, old)
        self._old.clear()
        if self._r >= 0:
            signal.set_wakeup_fd(self._old_fd)
            _close(self._r, self._w)
            self._r = self._w = -1


def _wait_forwarding(pid: int, signals: _Caught, watch: _GroupWatch | None) -> int:
    """Wait for the child, passing on the signals meant for it (see the module's docstring); its
    exit code (128+N if killed by signal N)."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
        # SIGCHLD wakes us when the child ends; the timeout is a safety net, not a poll.
        got = signals.wait(1.0)
        if watch is not None:
            watch.refresh()  # its reports of signals we never got grow stale, not old
        for sig in got:
            if sig in _WAITED and sig != signal.SIGCHLD:
                try:
                    _pass_on(pid, watch, sig)
                except Exception as e:  # the command is waited for whatever happens here
                    warn_once("signals", f"a signal was not passed on to the command: {e}")


def _pass_on(pid: int, watch: _GroupWatch | None, sig: int) -> None:
    """Send the child a signal we got unless it got it too; on SIGTSTP stop with it."""
    if not _reached_child(pid, watch, sig):
        _send(pid, sig)
    if sig == signal.SIGTSTP and _job_control_parent() and _alive(pid):
        os.kill(os.getpid(), signal.SIGSTOP)  # until the shell's fg/bg (or a SIGCONT) wakes us


def _reached_child(pid: int, watch: _GroupWatch | None, sig: int) -> bool:
    """Whether a signal we got was sent to our whole process group and the child is in it."""
    try:
        if os.getpgid(pid) != os.getpgrp():
            return False  # the command has a group of its own: nothing sent to ours reaches it
    except OSError:
        return True  # the child is gone: nothing to send
    return watch is not None and watch.saw(sig, GROUP_WINDOW)


def _send(pid: int, sig: int) -> None:
    # Never raises: the child may have exited (or not be ours to signal any more).
    with contextlib.suppress(OSError, ValueError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Whether the child has not exited yet (it stays ours to wait for)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except OSError:
        return False


def _job_control_parent() -> bool:
    """Whether our parent is a job-control shell that would see us stop: it is in another process
    group of our session. Otherwise a SIGTSTP does not stop us (POSIX discards it in an orphaned
    group, and our parent would not notice)."""
    try:
        parent = os.getppid()
        return os.getpgid(parent) != os.getpgrp() and os.getsid(parent) == os.getsid(0)
    except OSError:
        return False


# The watcher: a Python with no site, in our process group, that reports each signal it gets as a
# byte on `report` (the C-level handler writes it: signal.set_wakeup_fd) and exits when `lifeline`
# closes, i.e. when gpufeed ends however it ends.
_WATCHER = """
import os, signal, sys
report, lifeline = int(sys.argv[1]), int(sys.argv[2])
low, high = sorted((report, lifeline))
os.closerange(3, low)  # nothing the command is handed is held open by us
os.closerange(low + 1, high)
os.closerange(high + 1, 1 << 20)
os.set_blocking(report, False)
for sig in sys.argv[3].split(","):
    signal.signal(int(sig), lambda *_: None)
signal.set_wakeup_fd(report, warn_on_full_buffer=False)
os.write(report, b"\\0")
signal.pthread_sigmask(signal.SIG_SETMASK, [])
while os.read(lifeline, 1):
    pass
"""


_UNWATCHED = "a signal sent to the whole process group may reach the command twice"


class _GroupWatch:
    """A process in our group that is sent nothing of its own: what it gets went to the group."""

    def __init__(self, pid: int, report: int, lifeline: int) -> None:
        self.pid, self._report, self._lifeline = pid, report, lifeline
        self._seen: list[tuple[int, float]] = []  # (signal, when read), not matched yet

    @classmethod
    def start(cls, command: list[str], timeout: float = 10.0) -> _GroupWatch | None:
        """Start the watcher and wait until it listens; None (warned once) if it cannot. Its argv
        ends with `command`, so that `pkill -f` of the command's words, which also matches us,
        matches it too."""
        report_r, report_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        pid = None
        try:
            os.set_inheritable(report_w, True)
            os.set_inheritable(lifeline_r, True)
            sigs = ",".join(str(int(s)) for s in (*_FORWARDED, *_JOB_CONTROL))
            argv = [sys.executable, "-I", "-S", "-c", _WATCHER, str(report_w), str(lifeline_r)]
            argv += [sigs, "--", *command]
            null = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0)]
            null += [(os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
            watched = (*_FORWARDED, *_JOB_CONTROL)
            pid = os.posix_spawn(
                sys.executable, argv, os.environ, file_actions=null, setsigmask=watched
            )
            os.close(report_w)
            os.close(lifeline_r)
            report_w = lifeline_r = -1
            ready, _, _ = select.select([report_r], [], [], timeout)
            if not ready or os.read(report_r, 1) != b"\0":
                raise OSError(f"it did not start within {timeout:g} s")
            os.set_blocking(report_r, False)
            return cls(pid, report_r, lifeline_w)
        except Exception as e:
            warn_once("signal-watch", f"{_UNWATCHED}: its watcher did not start ({e})")
            _close(report_r, report_w, lifeline_r, lifeline_w)
            if pid is not None:
                _stop_watcher(pid)
            return None

    def saw(self, sig: int, wait: float) -> bool:
        """Whether the watcher got `sig` too (waiting up to `wait` s for its report); a report
        counts once."""
        deadline = time.monotonic() + wait
        while True:
            now = self.refresh()
            for i, (s, _) in enumerate(self._seen):
                if s == sig:
                    del self._seen[i]
                    return True
            if now >= deadline or self._report < 0:
                return False
            select.select([self._report], [], [], deadline - now)

    def refresh(self) -> float:
        """Take the watcher's new reports and drop those unmatched for `_STALE` s; the time now."""
        now = time.monotonic()
        self._seen = [(s, t) for s, t in self._seen if now - t < _STALE]
        if self._report < 0:
            return now
        try:
            data = os.read(self._report, 256)
        except BlockingIOError:
            return now
        if not data:  # the watcher is gone: nothing more will be reported
            os.close(self._report)
            self._report = -1
            warn_once("signal-watch", f"{_UNWATCHED}: its watcher process ended")
        self._seen += [(b, now) for b in data]
        return now

    def close(self) -> None:
        """Stop the watcher and close our ends."""
        _close(self._report, self._lifeline)
        self._report = self._lifeline = -1
        _stop_watcher(self.pid)


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def _stop_watcher(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)  # also where it is stopped
        os.waitpid(pid, 0)
