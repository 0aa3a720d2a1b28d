"""StepOutlier: robust statistics on per-step times, the outlier steps named; not the steps of a
period (PeriodicStall's) or the bursts of a reported loader bottleneck.

On a busy machine: test_busy_host.py.
"""

from __future__ import annotations

import numpy as np
from rule_runs import RunBuilder, jittered, rules


def test_outliers_are_named_with_their_times(builder: RunBuilder) -> None:
    d = jittered(300)
    d[120], d[250] = 1.0, 0.6
    f = rules(builder.steps(d).build())["StepOutlier"]
    assert f.evidence["outlier_steps"] == 2
    assert f.evidence["steps"].startswith("120 (1000 ms), 250 (600 ms)")
    assert f.title.startswith("2 outlier steps,") and f.recommendation.startswith(
        "Steps 120, 250 cost"
    )
    assert "PeriodicStall" not in rules(builder.build())


def test_one_outlier_is_named_in_the_singular(builder: RunBuilder) -> None:
    d = jittered(300)
    d[120] = 1.0
    run = builder.steps(d).build()
    assert "StepOutlier" not in rules(run)  # one slow step alone is no pattern to act on
    f = rules(run, StepOutlier={"min_steps": 1})["StepOutlier"]
    assert f.title.startswith("1 outlier step,") and f.recommendation.startswith("Step 120 costs")


def test_small_outliers_costing_little_stay_quiet(builder: RunBuilder) -> None:
    d = jittered(300)
    d[120] = 0.15  # 3x the median but 0.7% of the run
    assert "StepOutlier" not in rules(builder.steps(d).build())


def test_step_outlier_leaves_periods_to_periodic_stall_as_configured(builder: RunBuilder) -> None:
    d = jittered(300)
    d[np.arange(300) % 60 == 7] += 1.0  # 5 stalls: a period only with min_periods <= 5
    run = builder.steps(d).build()
    assert "StepOutlier" not in rules(run)  # the default (3 periods) sees the period
    strict = rules(run, PeriodicStall={"min_periods": 8})
    assert "PeriodicStall" not in strict and "StepOutlier" in strict


def test_data_wait_bursts_of_a_reported_loader_bottleneck_are_not_outliers(
    builder: RunBuilder,
) -> None:
    # 8 workers crowding 2 cores: steps wait 60% of the time, and a few wait far longer, off any
    # period. DataLoaderBottleneck reports the waiting; its bursts are not separate outliers.
    d = jittered(300, step=0.02)
    waits = np.full(300, 0.03)
    waits[[57, 130, 201, 277]] = 0.6
    found = rules(builder.steps(d + waits, waits=waits).build())
    assert "DataLoaderBottleneck" in found and "StepOutlier" not in found
    # With DataLoaderBottleneck off, or in a run that waits little, StepOutlier names them.
    off = rules(builder.build(), DataLoaderBottleneck={"enabled": False})
    assert off["StepOutlier"].evidence["outlier_steps"] == 4


def test_a_slow_read_in_a_run_that_rarely_waits_is_an_outlier(builder: RunBuilder) -> None:
    d = jittered(300)
    waits = np.zeros(300)
    waits[[120, 250]] = 0.5  # 7% of the run's time: not input-bound
    found = rules(builder.steps(d + waits, waits=waits).build())
    assert "DataLoaderBottleneck" not in found
    assert found["StepOutlier"].evidence["steps"].startswith("120 (")
