"""PeriodicStall: every Nth step stalling is a period, found with its N and cost; a loader's own
period of waits is not a stall, and healthy jitter is neither a period nor outliers.

On a busy machine: test_busy_host.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from rule_runs import RunBuilder, healthy, jittered, rules


def test_every_nth_step_stalling_is_a_period_not_outliers(builder: RunBuilder) -> None:
    d = jittered(300)
    d[np.arange(300) % 25 == 7] += 0.4
    found = rules(builder.steps(d).build())
    f = found["PeriodicStall"]
    assert f.evidence["period_steps"] == 25
    assert f.evidence["cost_per_period_ms"] == pytest.approx(400, rel=0.05)
    assert "StepOutlier" not in found
    total = d[10:].sum()  # after the default warm-up of 2 s / 5 steps, within a step or two
    assert f.est_speedup == pytest.approx(total / (total - 0.4 * 11), rel=0.05)


def test_period_survives_a_missed_stall_and_a_stray_outlier(builder: RunBuilder) -> None:
    d = jittered(400)
    idx = np.arange(400)
    d[(idx % 40 == 0) & (idx != 200)] += 0.5
    d[333], d[151] = 2.0, 1.5
    found = rules(builder.steps(d).build())
    assert found["PeriodicStall"].evidence["period_steps"] == 40
    assert found["StepOutlier"].evidence["steps"].startswith("333 (2000 ms), 151 (1500 ms)")


def test_every_nth_step_waiting_for_data_is_the_loaders_period_not_a_stall(
    builder: RunBuilder,
) -> None:
    # 3 loader workers, each a batch in turn: every 3rd step waits 150 ms for data
    d = jittered(300)
    waits = np.where(np.arange(300) % 3 == 1, 0.15, 0.0)
    found = rules(builder.steps(d + waits, waits=waits).build())
    assert "PeriodicStall" not in found and "StepOutlier" not in found
    f = found["DataLoaderBottleneck"]
    assert f.evidence["stall_period_steps"] == 3 and "One step in 3 waits" in f.recommendation


def test_healthy_jitter_is_neither() -> None:
    found = rules(healthy(RunBuilder(), n=500).build())
    assert not {"StepOutlier", "PeriodicStall"} & set(found)
