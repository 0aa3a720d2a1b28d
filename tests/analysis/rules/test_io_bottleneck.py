"""IOBottleneck: iowait or a read-rate plateau, only while steps wait on data."""

from __future__ import annotations

import numpy as np
from rule_runs import RunBuilder

from gpufeed.analysis.rules import run_rules


def fired(run, **overrides):
    return [f for f in run_rules(run, **overrides) if f.rule == "IOBottleneck"]


def test_high_iowait_while_waiting(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05).metric("cpu.iowait", 35.0)
    (f,) = fired(builder.build())
    assert f.evidence["iowait_mean_pct"] == 35.0 and "faster local storage" in f.recommendation


def test_disk_reads_at_a_plateau(builder: RunBuilder) -> None:
    rng = np.random.default_rng(1)
    builder.steps([0.1] * 100, waits=0.05)
    builder.metric("disk.read", lambda t: 250e6 * (1 + 0.02 * rng.standard_normal(len(t))))
    (f,) = fired(builder.build())
    assert 240 <= f.evidence["disk_read_p50_mb_s"] <= 260


def test_network_plateau_suggests_streaming_fixes(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05).metric("net.rx", 110e6)
    (f,) = fired(builder.build())
    assert "net_rx_p50_mb_s" in f.evidence and "stream larger shards" in f.recommendation


def test_bursty_reads_are_not_a_plateau(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05)
    builder.metric("disk.read", lambda t: np.where((t * 10).astype(int) % 5 == 0, 400e6, 1e6))
    assert fired(builder.build()) == []


def test_storage_busy_but_no_data_wait_is_fine(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.001).metric("cpu.iowait", 40.0).metric("disk.read", 300e6)
    assert fired(builder.build()) == []
