"""Zero-code hooks on real scripts under `gpufeed profile`: evaluation kept out of training steps,
samples per step read from the model's input, data wait measured whatever feeds the loop, phases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpufeed
from gpufeed.analysis.stats import step_summary

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
# eval_loop.py: per epoch, the samples of each optimizer step
PER_EPOCH = {"plain": [16] * 12 + [8], "ahead": [16] * 12 + [8], "accum": [16] * 12}


def _profile(run_profiled, script: str, mode: str) -> gpufeed.analysis.run.Run:
    cp, run_dir = run_profiled(SCENARIOS / script, mode)
    assert cp.returncode == 0 and run_dir is not None, cp.stderr[-2000:]
    return gpufeed.load(run_dir)


@pytest.mark.parametrize("mode", ["plain", "accum", "ahead"])
def test_validation_passes_are_evaluation_not_training_steps(run_profiled, mode):
    run = _profile(run_profiled, "eval_loop.py", mode)
    steps = run.steps
    assert steps["samples"].tolist() == PER_EPOCH[mode] * 4  # read-ahead shifts nothing
    assert len(run.evals) == 4  # one pass per epoch, the last after the final step
    assert (run.evals["batches"] == 4).all() and (run.evals["samples"] == 128).all()
    # no training step swallowed a validation pass: none spans one
    for ev in run.evals.itertuples():
        assert not ((steps["start"] < ev.start + 1e-6) & (steps["end"] > ev.end - 1e-6)).any()
    s = step_summary(run)
    assert s["eval_passes"] == 4 and s["eval_time"] >= float(run.evals["duration"].sum()) * 0.99
    assert s["training_time"] == pytest.approx(float(steps["duration"].sum()), rel=1e-6)
    rules = {f.rule: f for f in gpufeed.analyze(run)}
    assert "StepOutlier" not in rules and "PeriodicStall" not in rules, rules


def test_each_training_step_is_split_into_its_phases(run_profiled):
    run = _profile(run_profiled, "eval_loop.py", "plain")
    steps = run.steps.iloc[1:]  # the first step also holds start-up work
    parts = steps[["data_wait", "forward", "backward", "optimizer", "other"]]
    assert np.isfinite(parts.to_numpy()).all() and (parts >= -1e-6).all().all()
    total = parts.sum(axis=1)
    assert np.allclose(total, steps["duration"], rtol=1e-6, atol=1e-9)
    # the 20 ms "GPU" sleep sits between backward and the optimizer step: it is "other"
    assert float(steps["other"].median()) >= 0.015
    assert float(steps["forward"].median()) > 0 and float(steps["backward"].median()) > 0
    assert run.meta["ranks"][0]["cuda"] is False  # it never touched a GPU: no GPU rules for it
    assert run.meta["ranks"][0]["batch_kind"] == "image"


@pytest.mark.parametrize("mode", ["generator", "get_batch"])
def test_data_wait_is_measured_for_a_loop_fed_without_a_dataloader(run_profiled, mode):
    run = _profile(run_profiled, "any_iterator.py", mode)
    steps = run.steps.iloc[1:]  # the first step starts before any hook saw it: unknown
    assert len(steps) == 39 and (steps["samples"] == 6).all()
    # every step waits the 30 ms read; the rest is ~20 ms of "GPU" work and a few ms of compute
    assert (steps["data_wait"] >= 0.027).all()
    assert (steps["data_wait"] <= steps["duration"]).all()
    share = step_summary(run)["data_wait_share"]
    assert 0.4 <= share <= 0.75


def test_data_wait_is_unknown_where_nothing_measures_it(run_profiled, gpufeed_cli):
    run = _profile(run_profiled, "any_iterator.py", "no_module")
    assert len(run.steps) == 40 and run.steps["data_wait"].isna().all()
    assert np.isnan(step_summary(run)["data_wait_share"])
    import subprocess

    show = subprocess.run(gpufeed_cli("show", str(run.path)), capture_output=True, text=True)
    assert show.returncode == 0 and "unknown" in show.stdout and "0.0% of step" not in show.stdout


SHORT_LIVED_WORKERS = """
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
train = DataLoader(data, batch_size=4, num_workers=2)  # new workers every epoch, each lives briefly
val = DataLoader(data, batch_size=8, num_workers=3, persistent_workers=True)
for epoch in range(3):
    for x, y in train:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        for x, _ in val:
            model(x)
"""


def test_worker_count_comes_from_the_training_loader_as_the_hooks_saw_it(run_profiled):
    from gpufeed.analysis.rules import Context

    cp, run_dir = run_profiled(SHORT_LIVED_WORKERS, interval=1.0)
    assert cp.returncode == 0, cp.stderr[-2000:]
    run = gpufeed.load(run_dir)
    assert len(run.steps) == 6 and len(run.evals) == 3
    assert run.meta["ranks"][0]["loader_workers"] == 2  # not the validation loader's 3
    assert run.meta["ranks"][0]["batch_kind"] == "other"  # features, not images: no JPEG advice
    assert Context(run).worker_count == 2


TEXT_BATCHES = """
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
texts = [(f"sample {i}", i % 2) for i in range(16)]  # batches of strings: no tensor to classify
for texts_, y in DataLoader(texts, batch_size=4):
    torch.nn.functional.cross_entropy(model(torch.randn(len(texts_), 4)), y).backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_dataloader_without_workers_is_recorded_as_zero_workers_not_as_none(run_profiled):
    # batch_kind is None for batches of strings: loader_workers None as well read as "no
    # DataLoader seen", and the advice named a generator's parallelism instead of num_workers
    from gpufeed.analysis.rules import Context

    cp, run_dir = run_profiled(TEXT_BATCHES, interval=1.0)
    assert cp.returncode == 0, cp.stderr[-2000:]
    run = gpufeed.load(run_dir)
    assert run.meta["ranks"][0]["loader_workers"] == 0
    assert Context(run).loader_seen


SLOW_WORKER_START = """
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Data(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.randn(4), i % 2
    def __getstate__(self):  # pickled for each spawned worker, inside iter(loader)
        time.sleep(0.4)
        return {}

if __name__ == "__main__":  # spawned workers import this file
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Data(), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    for epoch in range(2):
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
"""


def test_worker_start_up_inside_iter_is_data_wait_not_compute(run_profiled):
    cp, run_dir = run_profiled(SLOW_WORKER_START)
    assert cp.returncode == 0, cp.stderr[-2000:]
    steps = gpufeed.load(run_dir).steps
    assert len(steps) == 4
    # the second epoch's first step waited for iter() to pickle the dataset for its worker
    assert steps["data_wait"].iloc[2] >= 0.4
    assert steps["other"].iloc[2] < 0.4


WAITING_LOOP = """
import sys
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Data(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        end = time.perf_counter() + 0.005
        if sys.argv[1] == "burn":  # decoding in the training process itself (num_workers=0)
            while time.perf_counter() < end:
                pass
        else:  # reading from a slow disk: asleep
            time.sleep(0.005)
        return torch.randn(4), i % 2

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Data(), batch_size=4):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
"""


def _measured_steps(run_profiled, script: str, mode: str, steps: int, workers: bool = False):
    """The steps of `script MODE` profiled: `steps` of them, each with its wait's CPU measured but
    the first where it starts worker processes (forking them is not loading)."""
    cp, run_dir = run_profiled(script, mode)
    assert cp.returncode == 0, cp.stderr[-2000:]
    s = gpufeed.load(run_dir).steps
    assert len(s) == steps and s["data_wait_cpu"].iloc[1:].notna().all()
    assert s["data_wait_cpu"].isna().iloc[0] == workers
    return s.iloc[1:] if workers else s


def test_the_cpu_a_training_process_burns_while_it_waits_is_measured(run_profiled):
    share = {}
    for mode in ("burn", "sleep"):
        steps = _measured_steps(run_profiled, WAITING_LOOP, mode, 16)
        share[mode] = steps["data_wait_cpu"].sum() / steps["data_wait"].sum()
    # a full core while it loads, none while it sleeps (a shared 2-core host may halve the first)
    assert share["burn"] > 0.4 and share["sleep"] < 0.25, share


PICKLED_BATCHES = """
import sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

class Images(Dataset):
    def __len__(self):
        return 64 * 12
    def __getitem__(self, i):
        return np.full((3, 224, 224), i % 255, dtype=np.uint8), i % 2

def numpy_collate(items):  # NumPy batches are pickled through a pipe; tensors use shared memory
    return np.stack([a for a, _ in items]), np.array([b for _, b in items])

if __name__ == "__main__":
    collate = numpy_collate if sys.argv[1] == "numpy" else None
    model = torch.nn.Conv2d(3, 4, 3, stride=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Images(), batch_size=64, num_workers=2, collate_fn=collate):
        model(torch.as_tensor(x).float()).mean().backward()
        opt.step()
        opt.zero_grad()
"""


def test_unpickling_batches_shows_as_training_thread_cpu_inside_the_wait(run_profiled):
    per_batch = {}
    for mode in ("numpy", "tensor"):
        steps = _measured_steps(run_profiled, PICKLED_BATCHES, mode, 12, workers=True)
        # the mean: a batch that arrives out of turn is unpickled in an earlier step's wait
        per_batch[mode] = float(steps["data_wait_cpu"].mean())
    # 9.6 MB of NumPy unpickled per batch against a shared-memory handle: CPU time, whatever the load
    assert per_batch["numpy"] > 3 * per_batch["tensor"], per_batch


FORKED_TRAINERS = """
import multiprocessing as mp
import torch

def train(steps):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    children = [ctx.Process(target=train, args=(n,)) for n in (7, 11)]
    for c in children:
        c.start()
    for c in children:
        c.join()
    print("exit codes", [c.exitcode for c in children])
"""


def test_a_forked_multiprocessing_child_records_every_step_and_its_end(run_profiled):
    # multiprocessing children end with os._exit (no atexit): steps of the last half second too
    cp, run_dir = run_profiled(FORKED_TRAINERS)
    assert cp.returncode == 0 and "exit codes [0, 0]" in cp.stdout, cp.stderr
    run = gpufeed.load(run_dir)
    assert sorted(run.steps.groupby("pid").size()) == [7, 11]
    ended = {r["pid"]: r.get("end") for r in run.meta["ranks"]}
    assert len(ended) == 2 and all(ended.values())
