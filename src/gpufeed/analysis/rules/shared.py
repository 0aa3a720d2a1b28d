"""Parameters that one rule owns and other rules read too, declared here so that no rule module
imports another: a rule spreads a setting's `params` into its own (same names, defaults and
`--set` keys), and a reader gets the values in force with `Context.rule_params(setting)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufeed.analysis.rules.params import INPUT_BOUND, Param

# % of a core at which a process counts as CPU-saturated (CPUBottleneck's `busy` by default).
BUSY = 80.0


@dataclass(frozen=True)
class Shared:
    """Some parameters of the rule `id` (its `--set ID.param` section) that other rules read."""

    id: str
    params: dict[str, Param]


# When loader workers count as CPU-bound: CPUBottleneck's, read by DataLoaderBottleneck and
# IOBottleneck, so that all three draw the line at the same place.
CPU_SATURATION = Shared(
    "CPUBottleneck",
    {
        "busy": Param(BUSY, "% of one core at which a process counts as CPU-saturated"),
        "host_busy": Param(90.0, "median whole-host CPU % at which the host counts as saturated"),
    },
)

# How a periodic stall is found (`periods.find_period`): PeriodicStall's, read by
# DataLoaderBottleneck (stalls that wait for data) and StepOutlier (slow steps a period explains).
STALL_PERIOD = Shared(
    "PeriodicStall",
    {
        "min_ratio": Param(
            1.5, "a stalled step takes at least this many times the other steps' median"
        ),
        "match": Param(0.7, "share of the period's steps that must be stalled", share=True),
        "min_periods": Param(3, "periods that must be seen", least=2),
        "max_chance": Param(
            0.001,
            "chance at most that steps slow at random (other load) line up on some period as well",
            share=True,
        ),
        "min_lost_share": Param(0.02, "share of run time the stalls must cost", share=True),
    },
)

# The data-wait share at which DataLoaderBottleneck reports: StepOutlier leaves steps slow from
# waiting for data to it where it runs (its `enabled`) and the rank waits that much.
INPUT_WAIT = Shared(
    "DataLoaderBottleneck",
    {
        "threshold": Param(
            INPUT_BOUND, "data-wait share of step time that triggers a warning", share=True
        ),
    },
)
