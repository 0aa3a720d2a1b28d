"""StepOutlier, PeriodicStall and BatchSize on a busy machine: step times spread by other load.

Synthetic step frames with seeded heavy-tailed noise: a stall every N steps is still found with its
N, noise alone makes neither a period nor outliers to act on, and a slow step while other
processes filled the host is not blamed on the job.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from rule_runs import RunBuilder

from gpufeed.analysis.rules import run_rules

SEEDS = range(8)


def rules(run, **overrides):
    return {f.rule: f for f in run_rules(run, **overrides)}


def lognormal(n: int, rng: np.random.Generator) -> np.ndarray:
    """Steps of 200 ms (median) spread as on a 2-core machine with one core taken: about 1 in 4
    is 1.5x the median or more."""
    return 0.2 * rng.lognormal(0.0, 0.7, n)


def pareto(n: int, rng: np.random.Generator) -> np.ndarray:
    """Steps of 50 ms with a heavier tail (Pareto): 1 in 20 is 3x or more, 1 in 300 10x."""
    return 0.05 * (1 + rng.pareto(2.5, n))


def regimes(n: int, rng: np.random.Generator) -> np.ndarray:
    """Stretches of 10-30 steps alternately fast (50 ms) and slow (240 ms), as when another job
    takes and leaves the core that torch's second thread runs on."""
    d, slow = [], bool(rng.integers(2))
    while len(d) < n:
        d += [0.24 if slow else 0.05] * int(rng.integers(10, 30))
        slow = not slow
    return np.asarray(d[:n]) * rng.lognormal(0.0, 0.15, n)


def bimodal(n: int, rng: np.random.Generator) -> np.ndarray:
    """Steps of 8 ms of which 4 in 10 take 90 ms, in no order: torch's two threads on a 2-core
    machine, one of them often waiting for the core another job holds (seen beside a CPU hog)."""
    return np.where(rng.random(n) < 0.4, 0.09, 0.008) * rng.lognormal(0.0, 0.3, n)


NOISE: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "lognormal": lognormal,
    "pareto": pareto,
    "regimes": regimes,
    "bimodal": bimodal,
}


def _host(b: RunBuilder, util: float | Callable[[np.ndarray], np.ndarray]) -> RunBuilder:
    """A 2-core host at `util` % whose training process keeps one core busy."""
    b.metric("cpu.util", util)
    for core in range(2):
        b.metric("cpu.core", util, str(core))
    return b.process(1000, "main", 100.0, 3e9)


@pytest.mark.parametrize("noise", NOISE)
def test_a_stall_every_10_steps_is_found_however_noisy_the_steps(noise: str) -> None:
    # The reported case: a plain CPU loop sleeping 300 ms after every 10th step, beside a CPU hog.
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        d = NOISE[noise](200, rng)
        d[np.arange(200) % 10 == 3] += 0.3
        found = rules(_host(RunBuilder(cpu_count=2).steps(d), 100.0).build())  # a full host
        assert "PeriodicStall" in found, (noise, seed)
        f = found["PeriodicStall"]
        assert f.evidence["period_steps"] == 10 and f.evidence["first_stalled_step"] % 10 == 3
        assert "StepOutlier" not in found, (noise, seed, found["StepOutlier"].evidence)


@pytest.mark.parametrize("noise", NOISE)
def test_noise_alone_makes_no_period(noise: str) -> None:
    for seed in SEEDS:
        d = NOISE[noise](200, np.random.default_rng(100 + seed))
        assert "PeriodicStall" not in rules(RunBuilder().steps(d).build()), (noise, seed)


def test_a_true_period_of_5_is_not_read_as_10_under_noise() -> None:
    # A phase of 2N holds half the stalls: only the noise, not a stall missing, may make it finer.
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        d = lognormal(200, rng)
        d[np.arange(200) % 5 == 1] += 0.3
        f = rules(RunBuilder().steps(d).build())["PeriodicStall"]
        assert f.evidence["period_steps"] == 5, seed


def test_four_stalls_are_a_period_on_a_quiet_machine_but_not_among_noise() -> None:
    stalls = [55, 85, 115, 145]
    quiet = 0.05 * (1 + 0.02 * np.random.default_rng(0).standard_normal(150))
    quiet[stalls] += 0.5
    assert rules(RunBuilder().steps(quiet).build())["PeriodicStall"].evidence["period_steps"] == 30
    # Among steps of which 1 in 4 are slow anyway, 4 slow steps 30 apart are no evidence.
    noisy = lognormal(150, np.random.default_rng(0))
    noisy[stalls] += 0.5
    assert "PeriodicStall" not in rules(RunBuilder().steps(noisy).build())


def _spiky(seed: int) -> np.ndarray:
    """300 steps of 50 ms with 5 of them 5-8x longer, 10% of the run."""
    rng = np.random.default_rng(seed)
    d = 0.05 * (1 + 0.05 * rng.standard_normal(300))
    d[[60, 111, 170, 222, 281]] = 0.05 * rng.uniform(5, 8, 5)
    return d


@pytest.mark.parametrize("steps", ["spikes", "pareto"])
def test_slow_steps_while_other_processes_fill_the_host_are_not_the_jobs(steps: str) -> None:
    for seed in SEEDS:
        d = _spiky(seed) if steps == "spikes" else pareto(300, np.random.default_rng(seed))
        crowded = _host(RunBuilder(cpu_count=2).steps(d), 100.0).build()
        assert "StepOutlier" not in rules(crowded), seed  # a core's worth of others' work
    for seed in SEEDS:  # the same spikes with a core idle: the job's own
        idle = _host(RunBuilder(cpu_count=2).steps(_spiky(seed)), 40.0).build()
        assert rules(idle)["StepOutlier"].evidence["outlier_steps"] == 5, seed


def test_only_the_slow_steps_inside_another_jobs_burst_are_left_out() -> None:
    d = _spiky(0)
    start = 1.0 + np.concatenate([[0.0], np.cumsum(d)[:-1]])  # RunBuilder: back to back from 1 s
    burst = (start[111] - 0.3, start[170] + d[170] + 0.3)  # the host full around steps 111, 170
    b = RunBuilder(cpu_count=2).steps(d)
    run = _host(b, lambda t: np.where((t > burst[0]) & (t < burst[1]), 100.0, 40.0)).build()
    f = rules(run)["StepOutlier"]
    assert f.evidence["outlier_steps"] == 3
    assert {int(s.split()[0]) for s in f.evidence["steps"].split(", ")} == {60, 222, 281}


def test_a_single_slow_step_in_a_short_run_is_not_a_warning() -> None:
    # The reported false warning: one step 2.5x the median among 26 judged steps of ~21 ms, an
    # estimated x1.055 from a step that another job delayed.
    d = 0.021 * (1 + 0.01 * np.random.default_rng(3).standard_normal(52))
    d[40] = 2.5 * 0.021
    run = RunBuilder().steps(d).build()
    assert "StepOutlier" not in rules(run)
    assert "StepOutlier" in rules(run, StepOutlier={"min_steps": 1})  # the one step's cost


@pytest.mark.parametrize("noise", ["lognormal", "regimes"])
def test_steps_spread_by_other_load_have_no_outliers_to_act_on(noise: str) -> None:
    # Even where the host's CPU shows no other job (a core idle): the spread is measured in ratios.
    for seed in SEEDS:
        d = NOISE[noise](300, np.random.default_rng(200 + seed))
        found = rules(_host(RunBuilder(cpu_count=2).steps(d), 40.0).build())
        assert not {"StepOutlier", "PeriodicStall"} & set(found), (noise, seed)


def test_a_tiny_batch_on_a_busy_host_is_still_a_tiny_batch() -> None:
    # 2 ms steps spread by other load, the GPU at 20-35% (a spike now and then), 3 of 80 GB used.
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        d = 0.002 * rng.lognormal(0.0, 0.5, 2000)
        b = RunBuilder(cpu_count=2).steps(d, waits=0.0001 * rng.lognormal(0.0, 1.0, 2000))
        b.gpu(lambda t: 20 + 15 * np.abs(np.sin(7 * t)) + 60 * (np.sin(t) > 0.995), mem_used=3e9)
        found = rules(_host(b, 100.0).build())
        assert "BatchSize" in found and found["BatchSize"].evidence["data_wait_share"] < 0.1
        assert not {"StepOutlier", "PeriodicStall", "DataLoaderBottleneck"} & set(found), seed
