"""`gpufeed profile` under real signals: sent to its pid, to its process group, from a terminal,
stopped and continued (Ctrl-Z, `kill -STOP`/`-CONT`, Slurm's suspend/resume).

The profiled child logs every delivery of a signal it catches (its C-level handler writes a byte
per delivery: `signal.set_wakeup_fd`), so a signal passed on twice shows as two lines. A barrier
says when gpufeed is done with what was sent: a SIGUSR1 to gpufeed's pid, passed on after every
signal gpufeed took before it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufeed.profiler.session import read_meta

DEADLINE = 60.0  # seconds: a busy 2-core machine may start Python slowly

CHILD = """
import os, select, signal, sys
log, done, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
r, w = os.pipe()
os.set_blocking(w, False)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCONT):
    signal.signal(sig, lambda *_: None)
signal.set_wakeup_fd(w, warn_on_full_buffer=False)

def note(line):
    with open(log, "a") as f:
        f.write(line + "\\n")

note(f"ready {os.getpid()}")
while not os.path.exists(done):
    if select.select([r], [], [], 0.05)[0]:
        for sig in os.read(r, 64):
            note(signal.Signals(sig).name)
sys.exit(code)
"""

EXIT_CODE = 7


class Profiled:
    """`gpufeed profile -- python child.py`, started with `popen` (its session or group)."""

    def __init__(self, tmp_path: Path, cli: list[str], **popen: object) -> None:
        self.log, self.done = tmp_path / "signals.log", tmp_path / "done"
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        self.err_path = tmp_path / "stderr.txt"
        cmd = [*cli, "profile", "--out", str(tmp_path / "runs"), "--", sys.executable]
        cmd += [str(script), str(self.log), str(self.done), str(EXIT_CODE)]
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path, **popen
            )
        self.pid = self.proc.pid
        self.wait_until(lambda: self.lines()[:1], "the command to start")
        self.child = int(self.lines()[0].split()[1])

    def lines(self) -> list[str]:
        try:
            return self.log.read_text().splitlines()
        except FileNotFoundError:
            return []

    def count(self, name: str) -> int:
        return self.lines().count(name)

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_until(self, condition: Callable[[], object], what: str, live: bool = True) -> None:
        """Poll `condition` until true; fail naming `what` (and gpufeed's stderr) at the deadline
        or, with `live`, as soon as gpufeed has exited."""
        deadline = time.monotonic() + DEADLINE
        while not condition():
            if live and self.proc.poll() is not None:
                pytest.fail(
                    f"gpufeed exited ({self.proc.returncode}) before {what}:\n{self.stderr()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"no {what} within {DEADLINE:g} s; log {self.lines()}:\n{self.stderr()}"
                )
            time.sleep(0.02)

    def settle(self, *sent: int) -> None:
        """Wait until gpufeed has taken the signals `sent` and passed on what it passes on."""
        self.wait_until(lambda: not any(_pending(self.pid, s) for s in sent), "signal taken")
        before = self.count("SIGUSR1")
        os.kill(self.pid, signal.SIGUSR1)
        self.wait_until(lambda: self.count("SIGUSR1") == before + 1, "SIGUSR1 passed on")

    def finish(self) -> int:
        """Let the child exit; gpufeed's exit code, once its run is written."""
        self.done.touch()
        code = self.proc.wait(timeout=DEADLINE)
        err = self.stderr()
        assert "Traceback" not in err and "Errno" not in err, err
        meta = read_meta(_run_dir(err))
        assert meta["exit_code"] == EXIT_CODE and meta["end_time"], meta
        return code

    def kill_all(self) -> None:
        """Leave nothing running, whatever the test did."""
        for pid in (self.pid, self.child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)


def _run_dir(stderr: str) -> Path:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("gpufeed: profiling into "))
    return Path(line.removeprefix("gpufeed: profiling into ").strip())


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _pending(pid: int, sig: int) -> bool:
    status = _status(pid)
    mask = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return bool(mask >> (sig - 1) & 1)


def _stopped(pid: int) -> bool:
    return _status(pid)["State"].startswith("T")


@pytest.fixture
def profiled(tmp_path, gpufeed_cli):
    """`profiled(**popen)`: a started `Profiled`; whatever is left is killed at the end."""
    started: list[Profiled] = []

    def start(**popen: object) -> Profiled:
        started.append(Profiled(tmp_path, gpufeed_cli(), **popen))
        return started[-1]

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.kill_all()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("to", ["pid", "group"])
def test_a_signal_reaches_the_command_exactly_once(profiled, sig, to):
    # The group's signal reached the child from the kernel: passed on again, a second SIGINT
    # would interrupt the child's checkpoint save. The pid's must be passed on.
    run = profiled(start_new_session=True)
    if to == "group":
        os.killpg(run.pid, sig)
    else:
        os.kill(run.pid, sig)
    run.wait_until(lambda: run.count(sig.name) >= 1, f"{sig.name} at the command")
    run.settle(sig)
    assert run.finish() == EXIT_CODE
    assert run.count(sig.name) == 1, run.lines()


def test_a_group_signal_the_command_took_first_is_not_passed_on_again(profiled):
    # The same as above in the order that shows a second delivery for sure: gpufeed (stopped)
    # acts on the group's SIGINT only once the child has taken it, so that the two cannot merge
    # into one pending signal.
    run = profiled(start_new_session=True)
    os.kill(run.pid, signal.SIGSTOP)
    run.wait_until(lambda: _stopped(run.pid), "gpufeed stopped", live=False)
    os.killpg(run.pid, signal.SIGINT)
    run.wait_until(lambda: run.count("SIGINT") >= 1, "SIGINT at the command", live=False)
    os.kill(run.pid, signal.SIGCONT)
    run.settle(signal.SIGINT, signal.SIGCONT)
    assert run.finish() == EXIT_CODE
    assert run.count("SIGINT") == 1, run.lines()


@pytest.mark.parametrize("to", ["pid", "group"])
def test_stop_and_continue_cycles_survive(profiled, to):
    # kill -STOP/-CONT of gpufeed's pid, or of every process of the job as Slurm's suspend/resume
    # does. Each stop outlasts a second: a sigtimedwait() timeout it used to break.
    run = profiled(start_new_session=True)
    send = os.killpg if to == "group" else os.kill
    watched = [run.pid, run.child] if to == "group" else [run.pid]
    for cycle in (1, 2):
        send(run.pid, signal.SIGSTOP)
        run.wait_until(lambda: all(_stopped(p) for p in watched), "stop", live=False)
        time.sleep(1.5)  # the suspension itself, not a wait for anything
        send(run.pid, signal.SIGCONT)
        run.wait_until(lambda: not any(_stopped(p) for p in watched), "continue", live=False)
        run.settle(signal.SIGCONT)
        # continued once: by the kernel (group) or by gpufeed passing it on (pid)
        assert run.count("SIGCONT") == cycle, run.lines()
    os.kill(run.pid, signal.SIGINT)
    run.settle(signal.SIGINT)
    assert run.finish() == EXIT_CODE
    assert run.count("SIGINT") == 1, run.lines()


_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


@pytest.mark.parametrize("to", ["pid", "group"])
def test_sigtstp_stops_the_command_too_and_sigcont_continues_both(profiled, to):
    # As under a shell: a process group of its own in our session, so that SIGTSTP stops (in a
    # group without a parent outside it, POSIX discards it). "group" is the terminal's Ctrl-Z and
    # the shell's `fg`; "pid" is `kill -TSTP` and `kill -CONT` of gpufeed.
    run = profiled(**_OWN_GROUP)
    send = os.killpg if to == "group" else os.kill
    send(run.pid, signal.SIGTSTP)
    both = (run.pid, run.child)
    run.wait_until(lambda: all(_stopped(p) for p in both), "both stopped", live=False)
    send(run.pid, signal.SIGCONT)
    run.wait_until(lambda: not any(_stopped(p) for p in both), "both continued", live=False)
    run.settle(signal.SIGCONT)
    assert run.count("SIGCONT") == 1, run.lines()
    assert run.finish() == EXIT_CODE


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_signal_ignored_as_under_nohup_stays_ignored_for_the_command(profiled):
    # `nohup gpufeed profile -- ...`: the terminal's hangup must not end the command.
    run = profiled(start_new_session=True, preexec_fn=_ignore_sighup)
    ignored = int(_status(run.child)["SigIgn"], 16)
    assert ignored >> (signal.SIGHUP - 1) & 1
    os.killpg(run.pid, signal.SIGHUP)
    run.settle(signal.SIGHUP)
    assert run.finish() == EXIT_CODE


def test_ctrl_c_at_a_terminal_reaches_the_command_once(tmp_path, gpufeed_cli):
    # A real terminal: the pty's line discipline sends SIGINT to the foreground group.
    master, slave = os.openpty()

    def take_terminal() -> None:  # in the new session: the pty becomes its controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    run = None
    try:
        run = Profiled(
            tmp_path,
            gpufeed_cli(),
            stdin=slave,
            start_new_session=True,
            preexec_fn=take_terminal,
        )
        os.write(master, b"\x03")
        run.wait_until(lambda: run.count("SIGINT") >= 1, "SIGINT at the command")
        run.settle(signal.SIGINT)
        assert run.finish() == EXIT_CODE
        assert run.count("SIGINT") == 1, run.lines()
    finally:
        if run is not None and run.proc.poll() is None:
            run.kill_all()
        os.close(slave)
        os.close(master)
