"""Where the profiler cannot record every step as it should (several training threads in one
process, a forked copy of a training process), it says so once on stderr and in meta.json's
"partial_recording" (and the process's store), rather than recording a silent part."""

from __future__ import annotations

import os
import subprocess
import sys

import gpufeed
from gpufeed.profiler.session import read_meta, save_meta, write_meta
from gpufeed.profiler.store import read_store

# Three threads, each training its own model for 40 steps. The first steps once before the others
# start, so that its loop is the one recorded; the models live to the end (no optimizer is freed).
THREADS = """
import threading, torch
keep, first = [], threading.Event()
def train(steps):
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    keep.append((model, opt))
    x = torch.randn(8, 16)
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        first.set()
threads = [threading.Thread(target=train, args=(40,), name=f"trainer-{i}") for i in (1, 2, 3)]
threads[0].start()
first.wait()
for t in threads[1:]:
    t.start()
for t in threads:
    t.join()
"""

# Trains 20 steps, forks; the child trains 20 and ends with os._exit as forked children do, the
# parent trains 20 more.
FORKED = """
import os, torch
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 16)
def train(steps):
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
train(20)
pid = os.fork()
if pid == 0:
    train(20)
    os.write(1, f"child {os.getpid()}\\n".encode())
    os._exit(0)
train(20)
os.waitpid(pid, 0)
print("parent", os.getpid(), flush=True)
"""

# One training loop in a thread of its own with two optimizers (a GAN's), fed by DataLoader
# workers (forked processes that do not train): everything is recorded, nothing to say.
WHOLE = """
import threading, torch
from torch.utils.data import DataLoader, TensorDataset
def train():
    gen, disc = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    g_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
    d_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8, num_workers=2)
    for (x,) in data:
        d_opt.zero_grad()
        disc(gen(x).detach()).mean().backward()
        d_opt.step()
        g_opt.zero_grad()
        disc(gen(x)).mean().backward()
        g_opt.step()
t = threading.Thread(target=train, name="trainer")
t.start()
t.join()
"""


def _warnings(stderr: str, text: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("gpufeed: warning:") and text in ln]


def test_several_training_threads_are_said_once_and_in_meta(run_profiled):
    cp, run_dir = run_profiled(THREADS)
    assert cp.returncode == 0, cp.stderr
    assert len(_warnings(cp.stderr, "several threads train")) == 1, cp.stderr
    run = gpufeed.load(run_dir)
    (note,) = run.meta["partial_recording"]
    assert note["reason"] == "threads" and note["pid"] == int(run.steps["pid"].iloc[0])
    # the first thread's loop is recorded; every optimizer step of the other two is accounted for
    assert len(run.steps) == 40
    assert note["threads"] == {"trainer-2": 40, "trainer-3": 40}
    assert "trainer-2" in note["message"] and "one training loop per process" in note["message"]
    (store,) = run_dir.glob("steps-*.db")
    assert read_store(store)["info"]["partial_recording"] == [note]
    # and `gpufeed show` says it at the top, beside the run's status
    shown = subprocess.run(
        [sys.executable, "-m", "gpufeed", "show", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert shown.returncode == 0, shown.stderr
    assert "one training loop per process" in shown.stdout


def test_a_forked_trainer_is_recorded_and_said_once(run_profiled):
    cp, run_dir = run_profiled(FORKED)
    assert cp.returncode == 0, cp.stderr
    words = dict(line.split() for line in cp.stdout.splitlines())
    parent, child = int(words["parent"]), int(words["child"])
    assert len(_warnings(cp.stderr, f"forked from training process {parent}")) == 1, cp.stderr
    (note,) = read_meta(run_dir)["partial_recording"]
    assert note["reason"] == "forked" and note["pid"] == child and note["forked_from"] == parent
    assert note["rank"] == 0 and f"steps-{note['host']}-{child}.db" in note["message"]
    # the child's steps are written before its os._exit, apart from its parent's
    stores = {int(p.stem.rsplit("-", 1)[1]): read_store(p) for p in run_dir.glob("steps-*.db")}
    assert {pid: len(s["steps"]) for pid, s in stores.items()} == {parent: 40, child: 20}
    assert stores[child]["info"]["partial_recording"] == [note]
    assert "partial_recording" not in stores[parent]["info"]


def test_one_loop_with_two_optimizers_and_loader_workers_says_nothing(run_profiled):
    cp, run_dir = run_profiled(WHOLE)
    assert cp.returncode == 0, cp.stderr
    assert not _warnings(cp.stderr, ""), cp.stderr
    run = gpufeed.load(run_dir)
    assert "partial_recording" not in run.meta
    assert len(run.steps) == 8  # one step per batch, the discriminator's optimizer marking them


NOTE_WRITER = """
import sys
from gpufeed.profiler.session import note_partial
run_dir, who = sys.argv[1], int(sys.argv[2])
for i in range(15):
    note_partial(run_dir, [{"host": "h", "pid": who * 100 + i, "reason": "threads"}])
"""


def test_notes_of_several_processes_and_the_launchers_meta_all_survive(tmp_path):
    # Training processes add their notes while the launcher writes meta.json: a read-modify-write
    # of one must not undo another's (the run directory's lock).
    from gpufeed.profiler.session import note_partial

    write_meta(tmp_path, {"name": "t", "end_time": None})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [
        subprocess.Popen([sys.executable, "-c", NOTE_WRITER, str(tmp_path), str(w)], env=env)
        for w in (1, 2, 3)
    ]
    for i in range(30):
        save_meta(tmp_path, ticks=i)
    assert [w.wait(timeout=60) for w in writers] == [0, 0, 0]
    note_partial(tmp_path, [{"host": "h", "pid": 100, "reason": "threads", "again": True}])
    meta = read_meta(tmp_path)
    assert meta["ticks"] == 29 and meta["name"] == "t"
    pids = sorted(n["pid"] for n in meta["partial_recording"])
    assert pids == sorted(w * 100 + i for w in (1, 2, 3) for i in range(15))
    assert [n for n in meta["partial_recording"] if n["pid"] == 100] == [
        {"host": "h", "pid": 100, "reason": "threads", "again": True}
    ]
