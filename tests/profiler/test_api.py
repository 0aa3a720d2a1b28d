"""In-code API: `with gpufeed.profile():` and `gpufeed.step()` in a loop the hooks cannot see."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import gpufeed

CUSTOM_LOOP = textwrap.dedent(
    """
    import sys, time
    import gpufeed

    # A loop with no torch optimizer and no DataLoader: explicit steps define it.
    with gpufeed.profile(out=sys.argv[1], name="custom", interval=0.1) as p:
        for i in range(12):
            time.sleep(0.05)
            gpufeed.step(samples=5)
    print("RUN", p.run_dir)
    gpufeed.step(samples=5)  # outside the context: ignored
    """
)


def test_profile_context_and_step_record_a_custom_loop(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(CUSTOM_LOOP)
    cp = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    run_dir = cp.stdout.split("RUN", 1)[1].strip()
    assert run_dir.startswith(str(tmp_path / "runs" / "custom-"))
    run = gpufeed.load(run_dir)
    steps = run.steps
    assert len(steps) == 12 and (steps["samples"] == 5).all()
    assert (steps["duration"] >= 0.05).all()  # the first step starts when the context is entered
    assert run.meta["finished"] and run.meta["exit_code"] == 0
    # The sampler ran as a child process and watched this script.
    assert len(run.system) > 0
    assert set(run.processes["role"]) >= {"main"}


def test_step_without_profiling_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFEED_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    code = "import gpufeed\nfor _ in range(3): gpufeed.step(samples=1)\n"
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert list(tmp_path.iterdir()) == []


def test_profile_inside_gpufeed_profile_reuses_the_run(run_profiled):
    script = "import gpufeed\nwith gpufeed.profile() as p:\n    gpufeed.step(samples=2)\nprint('RUN', p.run_dir)\n"
    cp, run_dir = run_profiled(script)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split("RUN", 1)[1].strip() == str(run_dir.resolve())
    assert len(gpufeed.load(run_dir).steps) == 1


ENDING = textwrap.dedent(
    """
    import sys
    import gpufeed

    with gpufeed.profile(out=sys.argv[1], name="ending", interval=0.1) as p:
        print("RUN", p.run_dir, flush=True)
        gpufeed.step(samples=1)
        if sys.argv[2] == "exit3":
            sys.exit(3)
        if sys.argv[2] == "exit0":
            sys.exit()
        raise KeyboardInterrupt
    """
)


def test_the_run_records_the_exit_code_the_process_ends_with(tmp_path):
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    for how, code in (("exit3", 3), ("exit0", 0), ("ctrl-c", 130)):
        cp = subprocess.run(
            [sys.executable, str(script), str(tmp_path / how), how],
            capture_output=True,
            text=True,
            timeout=120,
        )
        run_dir = cp.stdout.split("RUN", 1)[1].split()[0]
        assert gpufeed.load(run_dir).meta["exit_code"] == code, how


CTRL_C = textwrap.dedent(
    """
    import sys, time
    import gpufeed

    with gpufeed.profile(out=sys.argv[1], name="ctrlc", interval=0.1) as p:
        try:
            print("ready", flush=True)  # inside the try: Ctrl-C may come at once
            time.sleep(120)
        except KeyboardInterrupt:  # the script saves a checkpoint and goes on
            deadline = time.monotonic() + 3
            while p._sampler.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            print("sampler alive after Ctrl-C:", p._sampler.poll() is None, flush=True)
    """
)


def test_a_ctrl_c_the_script_catches_leaves_the_system_sampler_running(tmp_path):
    import os
    import signal

    script = tmp_path / "ctrlc.py"
    script.write_text(CTRL_C)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "runs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    assert proc.stdout.readline().strip() == "ready"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches every process of the group
    out, err = proc.communicate(timeout=120)
    assert "sampler alive after Ctrl-C: True" in out, err
    assert "Traceback" not in err
