"""MaxInitializationTime: from process start to the first step."""

from __future__ import annotations

import pytest
from rule_runs import T0, RunBuilder, rules


def test_slow_start_is_measured_from_process_start_to_first_step(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, start=T0 + 25.0)
    f = rules(builder.build())["MaxInitializationTime"]
    assert f.evidence["init_seconds"] == pytest.approx(25.0)
    assert f.evidence["init_share"] == pytest.approx(25 / 35.5, rel=0.01)


def test_short_start_on_a_short_job_and_overrides(builder: RunBuilder) -> None:
    run = builder.steps([0.1] * 100, start=T0 + 4.0).build()
    assert "MaxInitializationTime" not in rules(run)
    assert "MaxInitializationTime" in rules(run, MaxInitializationTime={"min_seconds": 3})
