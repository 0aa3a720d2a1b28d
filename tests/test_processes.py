"""Whether a process of this host still runs."""

from __future__ import annotations

import os
import subprocess
import sys

from gpufeed.processes import alive


def test_this_process_runs_and_an_exited_one_does_not_even_before_it_is_reaped():
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie
    assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid)


def test_a_pid_no_process_can_have_is_not_running():
    assert not alive(2**40)
