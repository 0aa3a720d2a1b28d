"""Phases under the trainers people use: real loops and frameworks profiled by `gpufeed profile`.

Closure optimizers (LBFGS, `opt.step(closure)`, Lightning's automatic optimization) run forward
and backward inside the optimizer step; GANs step two optimizers on two models; accumulation,
AMP's GradScaler, torch.compile, DDP, Lightning's manual optimization and the Hugging Face Trainer
each wrap the step their own way. In every one, a step's phases add up to its duration with no
negative remainder, and each model call's sleep (tests/profiler/trainers) is counted as forward.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import gpufeed
from gpufeed.analysis.run import Run
from gpufeed.analysis.stats import PHASES, step_summary
from gpufeed.extras import installed

TRAINERS = Path(__file__).resolve().parent / "trainers"
LOOPS = ("closure", "lbfgs", "accumulate", "gan", "amp", "compile", "ddp")
FRAMEWORKS = {  # case: (gpufeed extra, script, mode)
    "lightning-auto": ("lightning", "lightning_fit.py", "auto"),
    "lightning-manual": ("lightning", "lightning_fit.py", "manual"),
    "hf-trainer": ("huggingface", "hf_train.py", None),
}
CASES = (*LOOPS, *FRAMEWORKS)
_RUNS: dict[str, Run] = {}


def _command(case: str) -> list[str]:
    if case in FRAMEWORKS:
        _, script, mode = FRAMEWORKS[case]
        return [sys.executable, str(TRAINERS / script), *([mode] if mode else [])]
    if case != "ddp":
        return [sys.executable, str(TRAINERS / "loops.py"), case]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [torchrun, "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(port), str(TRAINERS / "loops.py"), "ddp"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    """Every case profiled once, two at a time (2 cores), shared by this module's tests."""
    if not _RUNS:
        out = tmp_path_factory.mktemp("trainers")
        cases = [c for c in CASES if c not in FRAMEWORKS or installed(FRAMEWORKS[c][0])]

        def profile(case: str) -> tuple[str, Run]:
            cli = [sys.executable, "-m", "gpufeed.cli", "profile", "--out", str(out / case)]
            cp = subprocess.run(
                [*cli, "--interval", "0.2", "--", *_command(case)],
                capture_output=True, text=True, timeout=240, cwd=out,
            )  # fmt: skip
            assert cp.returncode == 0, f"{case}: {cp.stderr[-3000:]}"
            (run_dir,) = (out / case).iterdir()
            return case, gpufeed.load(run_dir)

        with ThreadPoolExecutor(max_workers=2) as pool:
            _RUNS.update(pool.map(profile, cases))
    return _RUNS


def _run(runs: dict[str, Run], case: str) -> Run:
    if case not in runs:
        pytest.skip(f"gpufeed[{FRAMEWORKS[case][0]}] is not installed")
    return runs[case]


@pytest.mark.parametrize("case", CASES)
def test_phases_add_up_to_each_step_with_nothing_negative(runs, case: str) -> None:
    run = _run(runs, case)
    steps = run.steps
    ranks = 2 if case == "ddp" else 1
    expected = {"lightning-auto": 24, "lightning-manual": 24, "hf-trainer": 16}.get(case, 24)
    assert len(steps) == expected * ranks
    parts = steps[list(PHASES)].to_numpy(dtype=float)
    assert np.isfinite(parts).all(), steps[list(PHASES)]
    assert (parts >= -1e-6).all(), steps[list(PHASES)].min()
    assert np.allclose(parts.sum(axis=1), steps["duration"], rtol=1e-6, atol=1e-9)
    summary = step_summary(run)
    shares = [summary[f"{p}_share"] for p in PHASES]
    assert sum(shares) == pytest.approx(1.0, abs=0.01) and min(shares) >= 0, shares


@pytest.mark.parametrize("case", CASES)
def test_every_model_call_is_forward_time(runs, case: str) -> None:
    steps = _run(runs, case).steps.iloc[1:]  # the first step also holds start-up work
    calls = {"lbfgs": 1, "accumulate": 4, "hf-trainer": 2}.get(case, 1)
    assert (steps["forward"] >= 0.005 * calls * 0.99).all(), steps["forward"].min()
    assert (steps["backward"] > 0).all()


@pytest.mark.parametrize("case", ["closure", "lbfgs", "lightning-auto"])
def test_a_closures_forward_and_backward_are_not_optimizer_time(runs, case: str) -> None:
    # The optimizer steps with a closure: its step encloses the forward (5 ms asleep) and the
    # backward, which must be taken out of it.
    steps = _run(runs, case).steps.iloc[1:]
    assert float(steps["optimizer"].median()) < float(steps["forward"].median())


def test_both_models_of_a_gan_are_timed_as_forward(runs) -> None:
    # The discriminator's optimizer steps first; the generator (20 ms asleep per call) becomes a
    # model at its own optimizer's first step, so from then on its call is forward, not "other".
    steps = runs["gan"].steps.iloc[2:]
    assert (steps["forward"] >= 0.02 + 3 * 0.002).all(), steps["forward"].min()


@pytest.mark.parametrize(("case", "passes"), [("lightning-auto", 2), ("hf-trainer", 1)])
def test_framework_validation_passes_are_evaluation(runs, case: str, passes: int) -> None:
    run = _run(runs, case)
    assert len(run.evals) == passes and (run.evals["batches"] > 0).all()


def test_samples_per_step_count_every_micro_batch(runs) -> None:
    assert (runs["accumulate"].steps["samples"] == 4 * 32).all()
    assert (runs["ddp"].steps["samples"] == 32).all()
    if "hf-trainer" in runs:
        assert (runs["hf-trainer"].steps["samples"] == 2 * 16).all()
