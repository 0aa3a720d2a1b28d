"""periods.py: the statistics under PeriodicStall and StepOutlier, one behaviour at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpufeed.analysis.rules.periods import binomial_tail, find_period, slow_mask


@pytest.mark.parametrize(("x", "m", "p"), [(0, 5, 0.3), (3, 5, 0.3), (5, 5, 0.3), (7, 40, 0.02)])
def test_binomial_tail_is_the_exact_sum(x: int, m: int, p: float) -> None:
    exact = sum(math.comb(m, j) * p**j * (1 - p) ** (m - j) for j in range(x, m + 1))
    assert binomial_tail(x, m, p) == pytest.approx(exact, rel=1e-9)
    assert binomial_tail(m + 1, m, p) == 0.0


def test_the_phase_and_its_stalled_steps_are_returned() -> None:
    d = np.full(120, 0.05)
    d[np.arange(120) % 12 == 5] = 0.5
    found = find_period(np.arange(120), d)
    assert found is not None and (found.n, found.r) == (12, 5)
    assert found.stalled.sum() == 10 and found.share == 1.0 and found.baseline == 0.05
    assert found.chance < 1e-6


def test_gaps_in_the_step_numbers_keep_the_phase() -> None:
    # Steps left out (a refill after replayed steps, a NaN duration): phases by step number.
    step = np.delete(np.arange(200), np.arange(30, 45))
    d = np.where(step % 8 == 2, 0.4, 0.05)
    found = find_period(step, d)
    assert found is not None and (found.n, found.r) == (8, 2)


def test_a_stricter_chance_needs_more_periods() -> None:
    rng = np.random.default_rng(0)
    d = 0.2 * rng.lognormal(0.0, 0.7, 120)
    d[np.arange(120) % 10 == 0] += 0.3
    assert find_period(np.arange(120), d) is not None
    assert find_period(np.arange(120), d, chance=1e-12) is None


def test_too_few_steps_for_min_periods_have_no_period() -> None:
    assert find_period(np.arange(5), np.array([0.1, 1.0, 0.1, 1.0, 0.1])) is None


def test_slow_steps_are_far_above_the_median_in_ratio() -> None:
    quiet = np.full(100, 0.05) * (1 + 0.01 * np.sin(np.arange(100)))
    quiet[[10, 20]] = [0.2, 0.09]  # 4x, and 1.8x (under min_ratio 2)
    assert np.flatnonzero(slow_mask(quiet, 5.0, 2.0)).tolist() == [10]
    # Steps that vary 2x anyway: 3x is within their spread.
    spread = 0.05 * np.exp(np.random.default_rng(1).normal(0.0, 0.4, 100))
    spread[10] = 3 * np.median(spread)
    assert not slow_mask(spread, 5.0, 2.0)[10]
