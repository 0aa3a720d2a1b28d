"""Elastic resumption: which samples of an epoch remain after a state saved on other counts of
ranks or workers, and which of them each new rank delivers.

The plan is a pure function of (seed, epoch, rank, world size, workers), so a state says exactly
which sample ids every rank of the saving job had delivered, without reading a shard. An epoch is
delivered in stages, one per count of (ranks, workers) it ran under:

1. stage 0 is the epoch's usual plan; a later stage plans only what the stages before it left:
   the ids the old ranks would have delivered that epoch (their planned ids, padded or dropped
   as usual) less those they delivered, in the epoch's read order;
2. those are cut into equal contiguous slices per new rank, as `ShardDataset` cuts an epoch:
   `drop_last=False` pads the last slices by wrapping to the start of the remainder (at most
   world_size - 1 of its samples come twice), `drop_last=True` leaves out the few left over.
   Every new rank so has the same number of batches (as DDP needs);
3. each rank's slice is cut into whole batches and dealt to its workers like any epoch
   (`BatchPlan` with `remainder=`); the epochs after it are the usual ones under the new counts.

A state carries the stages before its own (`"stages"`) while it is inside such an epoch, so it
resumes again on any counts. Each rank saves its own state; the ranks of a DDP job deliver the
same number of batches, so any one rank's state (rank 0's, as trainers save) stands for all.
Where they differ, `merge_states` of every rank's state records each rank's count.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.errors import OptionError

# the settings a state's stages and counts may change: everything else must match
COUNT_KEYS = ("world_size", "num_workers")


@dataclass(frozen=True)
class Stage:
    """A stretch of one epoch delivered under one count of ranks and workers: `batches[r]` is
    how many batches rank r delivered in it."""

    world_size: int
    num_workers: int
    batches: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batches": list(self.batches),
        }


@dataclass(frozen=True)
class Resumed:
    """Where a loader resumes: the next position, the plan to resume on (the loader's own, or
    one whose remainder epoch is what is left of an epoch begun on other counts) and the
    stages of that epoch delivered before."""

    at: Position
    plan: BatchPlan
    earlier: tuple[Stage, ...] = ()


def _count(what: str, value: Any, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise OptionError(
            f"loader state {what}={value!r} is not a whole number >= {least}: pass what "
            "Loader.state_dict() (or gpufeed.data.resume.merge_states) returned"
        )
    return value


def _stage(doc: Any, what: str) -> Stage:
    """A stage read from a state, checked."""
    if not isinstance(doc, dict) or not isinstance(doc.get("batches"), list | tuple):
        raise OptionError(
            f"loader state {what}={doc!r} is not a stage (world_size, num_workers, batches): "
            "pass what Loader.state_dict() returned"
        )
    world = _count(f"{what}.world_size", doc.get("world_size"), 1)
    workers = _count(f"{what}.num_workers", doc.get("num_workers"))
    batches = tuple(_count(f"{what}.batches", b) for b in doc["batches"])
    if len(batches) != world:
        raise OptionError(
            f"loader state {what} lists {len(batches)} ranks' batches for world_size={world}"
        )
    return Stage(world, workers, batches)


def stages_of(state: dict[str, Any]) -> tuple[tuple[Stage, ...], Stage]:
    """(the stages of the state's epoch before its own, its own stage), checked."""
    earlier = state.get("stages", [])
    if not isinstance(earlier, list | tuple):
        raise OptionError(f"loader state stages={earlier!r} is not a list of stages")
    before = tuple(_stage(doc, f"stages[{i}]") for i, doc in enumerate(earlier))
    world = _count("world_size", state["world_size"], 1)
    batches = state.get("rank_batches", [state["batch"]] * world)
    own = {"world_size": world, "num_workers": state["num_workers"], "batches": batches}
    return before, _stage(own, "rank_batches" if "rank_batches" in state else "batch")


def _rank_plan(
    base: BatchPlan,
    world_size: int,
    workers: int,
    rank: int,
    remainder: np.ndarray | None,
    epoch: int,
) -> BatchPlan:
    """The plan of `rank` of `world_size` with `workers` (over its own copy of the dataset)."""
    ds: ShardDataset = copy.copy(base.dataset)
    ds.rank, ds.world_size = rank, world_size
    rem = None if remainder is None else (epoch, share(remainder, rank, world_size, base.drop_last))
    return BatchPlan(ds, base.batch_size, workers, base.drop_last, rem)


def share(ids: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """`rank`'s contiguous slice of `ids`, the same size on every rank: padded by wrapping to the
    start (drop_last=False) or without the few left over (drop_last=True)."""
    per = len(ids) // world_size if drop_last else -(-len(ids) // world_size)
    if per * world_size > len(ids):
        ids = np.resize(ids, per * world_size)
    return ids[rank * per : (rank + 1) * per]


def remaining(base: BatchPlan, epoch: int, stages: Sequence[Stage]) -> np.ndarray:
    """Global ids of `epoch` not yet delivered after `stages`, each once, in read order: what
    the last stage's ranks would still have delivered. `base` gives the batch settings and data."""
    left: np.ndarray | None = None
    for i, stage in enumerate(stages):
        planned, delivered = [], []
        for rank, batches in enumerate(stage.batches):
            plan = _rank_plan(base, stage.world_size, stage.num_workers, rank, left, epoch)
            if batches > plan.batches_in(epoch):
                raise OptionError(
                    f"loader state: rank {rank} of {stage.world_size} delivered {batches} batches "
                    f"of epoch {epoch}, which has {plan.batches_in(epoch)} on it"
                    + (f" (stage {i})" if i < len(stages) - 1 else "")
                    + ": pass what Loader.state_dict() returned"
                )
            planned.append(plan.planned(epoch))
            delivered.append(plan.delivered(epoch, batches))
        ids = np.concatenate(planned)
        _, first = np.unique(ids, return_index=True)  # padding repeats some: keep the first
        ids = ids[np.sort(first)]
        left = ids[~np.isin(ids, np.concatenate(delivered))]
    assert left is not None, "no stage"
    return left


def resume(state: dict[str, Any], plan: BatchPlan, local: bool) -> Resumed:
    """Where the loader of `plan` (its rank, world size, workers) resumes from `state`, whose
    settings other than its counts were checked to match. The same counts resume as ever (0 and
    1 workers plan alike); other counts deliver the rest of the state's epoch, then the usual
    epochs. `local`: the loader's batches are made by its own processes or thread (they take its
    plan as is), not by a Ray cluster."""
    ds, epoch = plan.dataset, _count("epoch", state["epoch"])
    _count("batch", state["batch"])
    earlier, own = stages_of(state)
    if (own.world_size, max(1, own.num_workers)) == (ds.world_size, plan.workers):
        batch = own.batches[ds.rank] if "rank_batches" in state else state["batch"]
    else:  # what the saved stage delivered joins the stages before it; the rest is shared anew
        earlier = (*earlier, own) if any(own.batches) else earlier  # a stage of nothing is none
        batch = 0
    if not earlier:  # the usual epoch (on new counts: nothing of it delivered, as any epoch)
        if batch > plan.batches:
            raise OptionError(f"loader state batch={batch} is outside 0..{plan.batches}")
        return Resumed(Position(epoch, batch), _usual(plan))
    if not local:
        raise OptionError(
            f"loader state was saved with world_size={own.world_size}, num_workers="
            f"{own.num_workers} mid-epoch: the rest of its epoch is shared anew, which needs "
            "the loader's own workers, not a Ray cluster: resume with the same counts, or "
            "without cluster= here"
        )
    ids = share(remaining(plan, epoch, earlier), ds.rank, ds.world_size, plan.drop_last)
    mine = plan
    if not _same_remainder(plan.remainder, (epoch, ids)):
        mine = BatchPlan(ds, plan.batch_size, plan.workers, plan.drop_last, (epoch, ids))
    if batch > mine.batches_in(epoch):
        raise OptionError(
            f"loader state batch={batch} is outside 0..{mine.batches_in(epoch)}, the batches left "
            "of its epoch: pass what Loader.state_dict() returned"
        )
    if mine.batches_in(epoch) == 0:  # too few left for a whole batch per rank (drop_last)
        return Resumed(Position(epoch + 1, 0), _usual(plan))
    return Resumed(Position(epoch, batch), mine, earlier)


def _usual(plan: BatchPlan) -> BatchPlan:
    """`plan`, or the same without a remainder epoch."""
    if plan.remainder is None:
        return plan
    return BatchPlan(plan.dataset, plan.batch_size, plan.workers, plan.drop_last)


def _same_remainder(a: tuple[int, np.ndarray] | None, b: tuple[int, np.ndarray]) -> bool:
    return a is not None and a[0] == b[0] and np.array_equal(a[1], b[1])


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state from every rank's own (any order): rank 0's, with each rank's batches
    delivered (`rank_batches`), for ranks that did not deliver the same number."""
    by_rank = {s.get("rank"): s for s in states}
    world = len(states)
    if set(by_rank) != set(range(world)) or any(s.get("world_size") != world for s in states):
        raise OptionError(
            f"merge_states: give every rank's state once (ranks 0..world_size-1); got ranks "
            f"{sorted((s.get('rank') for s in states), key=str)} of world sizes "
            f"{sorted({s.get('world_size') for s in states}, key=str)}"
        )
    first = by_rank[0]
    for rank, s in sorted(by_rank.items()):
        differ = [k for k in s if k not in ("rank", "batch") and s[k] != first.get(k)]
        if differ:
            raise OptionError(
                f"merge_states: rank {rank}'s state differs from rank 0's in {differ}; merge the "
                "states saved at one step of one job"
            )
    return {**first, "rank_batches": [by_rank[r]["batch"] for r in range(world)]}
