"""Scenario runs: each bottleneck created for real on CPU under `gpufeed profile`, then diagnosed.

The confusion matrix: in every scenario the intended rules fire with the right evidence and all the
others stay quiet; the healthy run fires nothing. A scenario whose only extra finding is StepOutlier
is profiled again (twice at most): a systematic false outlier recurs, a burst from other load does not. The scenarios (tests/scenarios/*.py) are profiled
once, two at a time, and shared by the tests of this module.
"""

from __future__ import annotations

import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import gpufeed
from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules import Context
from gpufeed.analysis.rules.cpu_bottleneck import CPUBottleneck
from gpufeed.analysis.run import Run

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
EXPECTED: dict[str, set[str]] = {
    "slow_start": {"MaxInitializationTime"},
    "straggler": {"LoadBalancing", "DataLoaderBottleneck"},
    "healthy": set(),
    "slow_data": {"DataLoaderBottleneck"},
    "slow_disk": {"DataLoaderBottleneck"},  # no CPUBottleneck: the training thread sleeps
    "cpu_transform": {"DataLoaderBottleneck", "CPUBottleneck"},
    "crowded_workers": {"DataLoaderBottleneck", "CPUBottleneck"},
    "periodic_stall": {"PeriodicStall"},
    "memory_leak": {"GPUMemoryIncrease"},
    "eval_loop": set(),  # a validation pass per epoch is neither an outlier nor a stall
}
ALONE = {"crowded_workers"}  # fills every core: profiled after the others, not beside one
_FINDINGS: dict[str, dict[str, Finding]] = {}  # profiled once per session, by the first test asking
_STARVED: dict[str, str] = {}  # scenario -> why CPU attribution was impossible on this host
# StepOutlier names steps another process delayed (its advice lists "another job on the host"); on a
# busy shared 2-core runner a few such steps in a 2-s scenario are real but not the scenario's own.
_NOISE_RETRIES = 2


def _torchrun() -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [
        torchrun,
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
    ]


@pytest.fixture
def scenarios(run_profiled, tmp_path: Path) -> dict[str, dict[str, Finding]]:
    """Findings per scenario, by rule id."""
    if not _FINDINGS:

        def profile(name: str) -> tuple[str, dict[str, Finding]]:
            launcher = _torchrun() if name == "straggler" else None
            cp, run_dir = run_profiled(
                SCENARIOS / f"{name}.py", out=tmp_path / name, launcher=launcher, timeout=240
            )
            assert cp.returncode == 0 and run_dir is not None, f"{name}: {cp.stderr[-2000:]}"
            run = gpufeed.load(run_dir)
            if name in ("cpu_transform", "crowded_workers"):
                _note_starvation(name, run)
            return name, {f.rule: f for f in gpufeed.analyze(run)}

        with ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores: keep timing noise low
            _FINDINGS.update(pool.map(profile, [n for n in EXPECTED if n not in ALONE]))
        _FINDINGS.update(map(profile, sorted(ALONE)))
        for name in EXPECTED:  # an outlier from another job's burst on a shared host must recur
            for _ in range(_NOISE_RETRIES):
                if set(_FINDINGS[name]) - EXPECTED[name] != {"StepOutlier"}:
                    break
                _FINDINGS[name] = profile(name)[1]
    return _FINDINGS


def _note_starvation(name: str, run: Run) -> None:
    """Record when other load left a CPU-bound scenario's loading role under half a core (the
    training process) or under half the cores (all workers together): CPUBottleneck's documented
    blind spot, where CPU-bound and sleeping look alike. CI's otherwise idle runner never gets here."""
    ctx = Context(run)
    if ctx.host_cpu < CPUBottleneck.params["host_busy"].default:
        return
    if name == "cpu_transform":
        loading, _ = ctx.main_cpu_split()
        if loading < CPUBottleneck.params["busy"].default / 2:
            _STARVED[name] = (
                f"host oversubscribed by other work: CPU {ctx.host_cpu:.0f}% busy, the training "
                f"process got {loading:.0f}% of a core while loading"
            )
        return
    (host,) = ctx.rank_hosts
    workers = ctx.role_cores.get(host, {}).get("worker", 0.0)
    if workers < ctx.cores_of(host) / 2:
        _STARVED[name] = (
            f"host oversubscribed by other work: CPU {ctx.host_cpu:.0f}% busy, the loader workers "
            f"got {workers:.1f} of {ctx.cores_of(host)} cores"
        )


@pytest.mark.slow
def test_confusion_matrix_each_scenario_fires_exactly_its_rules(scenarios) -> None:
    fired = {name: set(found) for name, found in scenarios.items()}
    for name in _STARVED:
        fired[name] |= {"CPUBottleneck"}  # not judged, see _note_starvation
    wrong = {name: fired[name] for name in EXPECTED if fired[name] != EXPECTED[name]}
    table = "\n".join(
        f"  {name:15s} expected {sorted(EXPECTED[name])} fired {sorted(fired[name])}"
        + ("" if name not in wrong else "   <-- wrong")
        for name in EXPECTED
    )
    details = "\n".join(
        f"  {name}.{rule}: {f.evidence}" for name in wrong for rule, f in scenarios[name].items()
    )
    assert not wrong, f"confusion matrix:\n{table}\nevidence:\n{details}"


@pytest.mark.slow
def test_sleeping_dataset_waits_on_idle_workers(scenarios) -> None:
    f = scenarios["slow_data"]["DataLoaderBottleneck"]
    # 8 samples x 8 ms per batch from one worker against ~20 ms of step work.
    assert 0.4 <= f.evidence["data_wait_share"] <= 0.95
    assert f.evidence["num_workers"] == 1 and f.evidence["worker_cpu_pct"] < 40
    assert "mostly idle" in f.recommendation and f.est_speedup > 1.5


@pytest.mark.slow
def test_a_training_process_asleep_on_its_reads_is_pointed_at_storage(scenarios) -> None:
    f = scenarios["slow_disk"]["DataLoaderBottleneck"]
    # measured asleep, whatever else loads the host: more workers than cores, no CPU-cost cuts
    assert f.evidence["num_workers"] == 0 and "waits on storage or latency" in f.recommendation
    assert "workers that wait need no core each" in f.recommendation
    assert "cut the CPU cost" not in f.recommendation


@pytest.mark.slow
def test_cpu_heavy_transform_without_workers_blames_the_training_process(scenarios) -> None:
    if "cpu_transform" in _STARVED:
        pytest.skip(_STARVED["cpu_transform"])
    cpu = scenarios["cpu_transform"]["CPUBottleneck"]
    assert cpu.evidence["role"] == "main"
    assert cpu.evidence["main_cpu_while_waiting_from"] == "measured"  # across each wait
    loader = scenarios["cpu_transform"]["DataLoaderBottleneck"]
    assert loader.evidence["num_workers"] == 0 and "now 0" in loader.recommendation


@pytest.mark.slow
def test_workers_crowding_every_core_are_starved_not_idle(scenarios) -> None:
    # Four workers per core: each gets a fraction of one, together they fill the host.
    if "crowded_workers" in _STARVED:
        pytest.skip(_STARVED["crowded_workers"])
    loader = scenarios["crowded_workers"]["DataLoaderBottleneck"]
    assert loader.evidence["host_cpu_p50"] >= 90
    assert "CPU-bound" in loader.recommendation and "mostly idle" not in loader.recommendation
    assert "more workers would only share the same cores" in loader.recommendation
    cpu = scenarios["crowded_workers"]["CPUBottleneck"]
    assert cpu.evidence["role"] == "worker" and "no cores are left" in cpu.recommendation


@pytest.mark.slow
def test_checkpoint_every_10_steps_is_found_with_its_cost(scenarios) -> None:
    f = scenarios["periodic_stall"]["PeriodicStall"]
    assert f.evidence["period_steps"] == 10
    # Saved after step 9's optimizer step, the checkpoint delays the start of step 10 (a step spans
    # from the end of the previous one), so the stalled steps are 10, 20, ...
    assert f.evidence["first_stalled_step"] % 10 == 0
    assert f.evidence["cost_per_period_ms"] >= 300  # a 400 ms sleep plus the checkpoint


@pytest.mark.slow
def test_growing_tensor_list_shows_in_host_memory(scenarios) -> None:
    f = scenarios["memory_leak"]["GPUMemoryIncrease"]
    assert "training process" in f.evidence["memory"]
    assert f.evidence["growth_mb"] >= 250  # ~4 MB per post-warm-up step


@pytest.mark.slow
def test_slow_start_is_measured(scenarios) -> None:
    f = scenarios["slow_start"]["MaxInitializationTime"]
    assert f.evidence["init_seconds"] >= 25


@pytest.mark.slow
def test_straggler_rank_is_named(scenarios) -> None:
    assert scenarios["straggler"]["LoadBalancing"].evidence["slow_rank"] == 1
    assert scenarios["straggler"]["DataLoaderBottleneck"].evidence["rank"] == 1
