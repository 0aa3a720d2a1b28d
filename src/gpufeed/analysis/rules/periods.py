"""Statistics of step times that the step rules share: which steps are slow, the period on which
slow steps recur, and which steps other load on the host may have slowed.

On a busy machine the spread of step times widens and some steps are slow at random. So a period
is not read off the slow steps alone: for each period N and phase r tried, the steps at
step % N == r are compared with the other steps (their median, and how often those are as slow),
and the period must be unlikely to come from steps slow at random, over every period and phase
tried. A consistent excess every N steps is then found however noisy single steps are, and noise
alone makes no period.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.rules.context import Context

MAX_PERIOD = 20_000  # the longest period looked for, in steps
LOCAL = 5  # steps either side that `find_period`'s local search compares a step with
# Quantiles of the other steps that a stalled step must also exceed, a search each (0.5: only
# min_ratio x their median).
LEVELS = (0.5, 0.95)
IDLE_CORE = 1.0  # idle cores below which a host counts as full (for `slowed_by_others`)


@dataclass(frozen=True)
class Period:
    """Every `n`-th step is slow: the steps at step % n == r (`on`), of which `stalled` are slow
    (`share` of them).

    `baseline`: median of the other steps; `chance`: how likely steps slow at random would line up
    on some period and phase this well (over all that were tried)."""

    n: int
    r: int
    on: np.ndarray
    stalled: np.ndarray
    baseline: float
    chance: float
    share: float
    others: float  # how often the other steps are as slow

    def passes(self, match: float, chance: float) -> bool:
        """At least `match` of the phase's steps are stalled, at most `chance` by chance."""
        return self.share >= match and self.chance <= chance


def slow_mask(durations: np.ndarray, k: float, min_ratio: float) -> np.ndarray:
    """Steps far above the median: at least `min_ratio` x the median, and more than `k` robust
    deviations (MAD x 1.4826) above it on a log scale. Other load stretches step times by factors
    (a step waits for a core as long as another job holds it), so the spread is measured in
    ratios: a run whose steps vary 2x anyway has no outliers at 3x."""
    d = np.asarray(durations, dtype=float)
    log_d = np.log(np.maximum(d, 1e-12))
    med = float(np.median(log_d))
    mad = 1.4826 * float(np.median(np.abs(log_d - med)))
    return (log_d > med + k * mad) & (d > min_ratio * float(np.median(d)))


def find_period(
    step: np.ndarray,
    durations: np.ndarray,
    min_ratio: float = 1.5,
    match: float = 0.7,
    min_periods: int = 3,
    chance: float = 1e-3,
) -> Period | None:
    """The smallest period N (with its phase r) on which steps are consistently slow, or None.

    A phase's steps (step % N == r, at least `min_periods` of them) are stalled where they exceed
    `min_ratio` x the median of the other steps; at least `match` of them must be. And the count
    must be unlikely for steps slow at random as often as the other steps are (a binomial tail),
    at most `chance` over all the N x r tried (Bonferroni). Of several phases of one N the least
    likely by chance is taken.

    Other load spreads step times: a third of the steps may take 10x the median, and stalls of
    40x among them are then no rarer than they are at 1.5x. So the search is repeated with the
    bar raised to the other steps' 95th percentile (`LEVELS`), which the stalls still pass and
    most of the noise does not. And other load can switch a run between slow and fast stretches,
    which hides a stall in the spread of the whole run: so each search also runs on each step's
    time over the median of the steps around it (`LOCAL` either side: for N >= 3, whose stalls
    are a minority there) in runs of 4 such windows or more. The smallest period any search
    finds is taken, the chance counted over all of them; its stalled steps are those above
    `min_ratio` x the median of the other steps."""
    d = np.asarray(durations, dtype=float)
    steps = np.asarray(step, dtype=np.int64)
    top = min(len(d) // max(1, min_periods), MAX_PERIOD)
    if top < 2:
        return None
    series = [d, d / _local_median(d)] if len(d) >= 4 * (2 * LOCAL + 1) else [d]
    tried = len(series) * len(LEVELS) * (top * (top + 1) // 2 - 1)  # phases of each search
    found = [
        _Search(steps, one, top, min_periods, min_ratio, q, match, chance, tried).run()
        for one in series
        for q in LEVELS
    ]
    best = min((f for f in found if f is not None), key=lambda f: (f.n, f.chance), default=None)
    if best is None:
        return None
    baseline = float(np.median(d[~best.on]))
    stalled = best.on & (d > min_ratio * baseline)
    share = float(stalled.sum()) / max(1, int(best.on.sum()))
    return replace(best, baseline=baseline, stalled=stalled, share=share)


@dataclass(frozen=True)
class _Search:
    """`find_period`'s search over one series of step times at one bar (see there)."""

    steps: np.ndarray
    d: np.ndarray
    top: int
    min_periods: int
    ratio: float  # a stalled step is above ratio x the median of the others
    q: float  # ... and above their q-quantile
    match: float
    chance: float
    tried: int

    def run(self) -> Period | None:
        """The first period with a phase that passes, refined (`refine`); None if none does."""
        d, steps, n = self.d, self.steps, len(self.d)
        limit = math.log(self.chance / self.tried) if self.chance > 0 else -math.inf  # log
        ascending = np.sort(d)
        slowest_first = np.argsort(-d, kind="stable")
        log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
        contiguous = bool(np.all(np.diff(steps) == 1))
        for period in range(2, self.top + 1):
            counts = _phase_counts(steps, period, contiguous)
            most, least = int(counts.max()), int(counts.min())
            # Bounds of every phase's bar from the sorted steps alone: a quantile of the other
            # steps (at least n - most of them, at most n - least) lies between that of the
            # n - most smallest and `most` places above that of the n - least smallest.
            low = max(
                self.ratio * ascending[max(0, (n - most - 1) // 2)],
                ascending[max(0, math.floor(self.q * (n - most - 1)))],
            )
            high = max(
                self.ratio * ascending[min(n - 1, (n - least) // 2 + most)],
                ascending[min(n - 1, math.ceil(self.q * (n - least - 1)) + most)],
            )
            above_high = n - int(np.searchsorted(ascending, high, side="right"))
            p_low = (max(0, above_high - most) + 1.0) / (n + 2.0)  # others as slow, at least
            if most * math.log(p_low) > limit:  # not even every step of a phase slow would do
                continue
            # The steps above `low` hold every step stalled by any phase's threshold: counted per
            # phase, an upper bound of its stalled steps, whose chance (one term of the binomial
            # tail, at `p_low`) is a lower bound of its own.
            hits = slowest_first[: n - int(np.searchsorted(ascending, low, side="right"))]
            if len(hits) < self.match * self.min_periods:  # fewer still at longer periods
                break
            x = np.minimum(np.bincount(steps[hits] % period, minlength=period), counts)
            log_p = (
                log_fact[counts]
                - log_fact[x]
                - log_fact[counts - x]
                + x * math.log(p_low)
                + (counts - x) * math.log1p(-p_low)
            )
            maybe = (x >= self.match * counts) & (counts >= self.min_periods) & (x > 0)
            tests = [self.phase(period, int(r)) for r in np.flatnonzero(maybe & (log_p <= limit))]
            best = _least_likely([t for t in tests if t and t.passes(self.match, self.chance)])
            if best is not None:
                return self.refine(best)
        return None

    def phase(self, period: int, r: int) -> Period | None:
        """Phase r of `period` tested against the other steps, with its chance (Bonferroni over
        `tried`); None where there are no other steps."""
        on = self.steps % period == (r % period)
        off = self.d[~on]
        if len(off) == 0:
            return None
        baseline = float(np.median(off))
        bar = max(self.ratio * baseline, float(np.quantile(off, self.q)))
        stalled = on & (self.d > bar)
        m, x = int(on.sum()), int(stalled.sum())
        # How often a step off the phase is this slow (a pseudo-count either way: never 0 or 1).
        others = (float(np.sum(off > bar)) + 1.0) / (len(off) + 2.0)
        chance = min(1.0, binomial_tail(x, m, others) * self.tried)
        return Period(period, r % period, on, stalled, baseline, chance, x / max(m, 1), others)

    def refine(self, found: Period) -> Period:
        """`found`, or where one phase of k x its period (k = 2, 3, 4) within its phase passes
        as well while the k - 1 others within it are slow about as often as the steps off the
        phase (nearer that than the one), that one (refined again). Where other load makes many
        steps slow, a phase of N/2 can pass for a period of N: it holds every stalled step and
        enough slow ones beside. A true period N keeps its phase: each phase of 2N within it is
        as slow as the other."""
        k = 2
        while k <= 4 and found.n * k <= self.top:
            tests = [self.phase(found.n * k, found.r + j * found.n) for j in range(k)]
            finer = _least_likely([t for t in tests if t and t.passes(self.match, self.chance)])
            if finer is not None and all(
                t is finer or t is None or t.share < (finer.share + finer.others) / 2 for t in tests
            ):
                found, k = finer, 2
            else:
                k += 1
        return found


def _local_median(d: np.ndarray) -> np.ndarray:
    """Each step's median over the `LOCAL` steps either side of it, not itself (mirrored at the
    ends; the run's median where it is shorter than that), never 0."""
    if len(d) < 2 * LOCAL + 1:
        return np.full(len(d), max(float(np.median(d)), 1e-12))
    padded = np.pad(d, LOCAL, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * LOCAL + 1)
    around = np.delete(windows, LOCAL, axis=1)
    return np.maximum(np.median(around, axis=1), 1e-12)


def _least_likely(periods: list[Period]) -> Period | None:
    """The period least likely by chance (the first of equals), None for none."""
    return min(periods, key=lambda p: p.chance) if periods else None


def stall_period(steps: pd.DataFrame, p: Mapping[str, Any]) -> Period | None:
    """`find_period` over the steps of one rank, with PeriodicStall's parameters `p` (so that the
    rules that leave its steps to it see the period it reports). Three rules ask for the same
    rank's period in one analysis: the last few answers are kept."""
    step = steps["step"].to_numpy(dtype=np.int64)
    durations = steps["duration"].to_numpy(dtype=float)
    args = (p["min_ratio"], p["match"], int(p["min_periods"]), p["max_chance"])
    return _stall_period(step.tobytes(), durations.tobytes(), *args)


@lru_cache(maxsize=8)
def _stall_period(
    step: bytes, durations: bytes, min_ratio: float, match: float, min_periods: int, chance: float
) -> Period | None:
    found = find_period(
        np.frombuffer(step, dtype=np.int64),
        np.frombuffer(durations, dtype=float),
        min_ratio,
        match,
        min_periods,
        chance,
    )
    if found is not None:  # shared by the callers: read-only
        found.on.setflags(write=False)
        found.stalled.setflags(write=False)
    return found


def _phase_counts(steps: np.ndarray, period: int, contiguous: bool) -> np.ndarray:
    """Steps at each phase 0..period-1 (without a pass over the steps where they are contiguous)."""
    if contiguous:
        r = np.arange(period)
        return (steps[-1] - r) // period - (steps[0] - 1 - r) // period
    return np.bincount(steps % period, minlength=period)


def waits_for_data(found: Period, steps: pd.DataFrame) -> bool:
    """Whether the stalled steps of `found` (a period of `steps`, one rank's) are slow mostly from
    waiting for data: data wait is at least half their excess over the other steps (as when N
    loader workers each deliver a batch in turn), so the stall is the input pipeline's."""
    durations = steps["duration"].to_numpy(dtype=float)
    waits = steps["data_wait"].to_numpy(dtype=float)
    excess = float(np.sum(durations[found.stalled] - found.baseline))
    waited = float(np.sum(waits[found.stalled] - np.median(waits[~found.on])))
    return excess > 0 and waited >= 0.5 * excess


def binomial_tail(x: int, m: int, p: float) -> float:
    """P(X >= x) for X ~ Binomial(m, p): the chance of `x` or more of `m` steps slow at random."""
    if x <= 0:
        return 1.0
    if x > m:
        return 0.0
    j = np.arange(x, m + 1)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, m + 1)))])
    terms = log_fact[m] - log_fact[j] - log_fact[m - j] + j * np.log(p) + (m - j) * np.log1p(-p)
    top = float(terms.max())
    return min(1.0, float(np.exp(top) * np.sum(np.exp(terms - top))))


def slowed_by_others(ctx: Context, steps: pd.DataFrame, outside_cores: float) -> np.ndarray:
    """Per step of one rank: True where, in a sample interval the step overlaps, its host had less
    than `IDLE_CORE` idle and processes outside the run kept at least `outside_cores` busy: the
    step may have waited for a core they held (samples average over an interval, so a host with
    less than a core idle on average was full at times). All False where the host's CPU or the
    run's processes were not sampled (not known, so not assumed)."""
    none = np.zeros(len(steps), dtype=bool)
    if not len(steps):
        return none
    host = str(steps["host"].iloc[0])
    util = ctx.metric("cpu.util")
    util = util[util["host"] == host].sort_values("time")
    procs = ctx.processes[ctx.processes["host"] == host]
    if not len(util) or not len(procs):
        return none
    cores = ctx.sampled_cores(host)
    t = util["time"].to_numpy(dtype=float)
    busy = util["value"].to_numpy(dtype=float) / 100 * cores
    per_time = procs.groupby("time")["cpu"].sum() / 100
    ours = _nearest(per_time.index.to_numpy(dtype=float), per_time.to_numpy(), t, ctx.interval / 2)
    crowded = (cores - busy < IDLE_CORE) & (busy - ours >= outside_cores)  # NaN: False
    began = t - np.diff(t, prepend=t[0] - ctx.interval)
    first = np.searchsorted(t, steps["start"].to_numpy(dtype=float), side="right")
    last = np.searchsorted(began, steps["end"].to_numpy(dtype=float), side="left")
    total = np.concatenate([[0], np.cumsum(crowded)])
    return (last > first) & (total[np.maximum(last, first)] - total[first] > 0)


def _nearest(times: np.ndarray, values: np.ndarray, at: np.ndarray, within: float) -> np.ndarray:
    """`values` sampled at `times` (sorted), read at each of `at`: the nearest within `within`
    seconds, NaN where none is."""
    if not len(times):
        return np.full(len(at), np.nan)
    i = np.clip(np.searchsorted(times, at), 1, max(1, len(times) - 1))
    lo = np.clip(i - 1, 0, len(times) - 1)
    hi = np.clip(i, 0, len(times) - 1)
    pick = np.where(np.abs(times[lo] - at) <= np.abs(times[hi] - at), lo, hi)
    out = values[pick].astype(float)
    out[np.abs(times[pick] - at) > within] = np.nan
    return out
