"""Where a Loader is in its epochs, and its resumption: `state_dict()` says where, and
`load_state_dict()` makes the next iteration deliver exactly the batches not yet delivered
(on other counts of ranks or workers through `resume`).

Apart from `loader` so that the Loader only wires the stages; its position is one `EpochPosition`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.plan import Position
from gpufeed.data.resume import COUNT_KEYS, Stage, resume
from gpufeed.errors import OptionError

# what fixes the order a state's position counts in; not the rank: every rank has the same
# batches per epoch, and DDP trainers (Lightning) save rank 0's state and load it on every rank;
# the counts (COUNT_KEYS) may differ: the rest of the epoch is then shared anew (`resume`)
STATE_KEYS = ("seed", "world_size", "num_workers", "batch_size", "samples", "drop_last")
# checked where saved (older states lack them); "index": which shards, in which order
ORDER_KEYS = ("shuffle", "shuffle_buffer", "index")


@dataclass
class EpochPosition:
    """A Loader's place in its epochs: what the current iteration delivered, and what the next
    one starts from."""

    epoch: int  # of the current (or last) iteration
    delivered: int = 0  # batches of the current epoch handed to the loop
    next: Position | None = None  # set by set_epoch / load_state_dict
    iterated: bool = False
    fresh: Position | None = None  # where the iteration no batch was taken from starts
    live: Any = None  # weakref to that iteration
    token: int = 0  # the iteration in progress
    earlier: tuple[Stage, ...] = ()  # the stages of an epoch resumed on other counts before it


def index_digest(dataset: ShardDataset) -> str:
    """Which shards of `dataset`, with which samples, in which order: the same count of images packed
    another way (another shard size) orders an epoch differently, so a position in it means
    other samples."""
    shards = [(s.name, s.samples, s.sha256) for s in dataset.index.shards]
    return hashlib.sha256(repr(shards).encode()).hexdigest()[:16]


def index_id(loader: Any) -> str:
    """`index_digest` of the Loader's dataset, computed once."""
    if loader._index_key is None:
        loader._index_key = index_digest(loader.dataset)
    return loader._index_key


def state_dict(loader: Any) -> dict[str, Any]:
    """`Loader.state_dict()`: the epoch and how many of its batches were delivered, with what
    fixes the order they count in."""
    pos: EpochPosition = loader._pos
    plan = loader.plan
    live = pos.live() if pos.live is not None else None
    running = (  # an epoch part delivered: set_epoch mid-epoch applies to the next one
        live is not None
        and live._token == pos.token
        and 0 < pos.delivered < plan.batches_in(pos.epoch)
    )
    if pos.next is not None and not running:  # load_state_dict or set_epoch, not iterated
        epoch, batch = pos.next.epoch, pos.next.batch
    else:
        epoch, batch = pos.epoch, pos.delivered
    if batch >= plan.batches_in(epoch):
        epoch, batch = epoch + 1, 0
    ds = loader.dataset
    state = {
        "epoch": epoch,
        "batch": batch,
        "seed": ds.seed,
        "world_size": ds.world_size,
        "rank": ds.rank,
        "num_workers": loader.num_workers,
        "batch_size": loader.batch_size,
        "samples": ds.index.total,
        "drop_last": loader.drop_last,
        "shuffle": ds.shuffle,
        "shuffle_buffer": ds.shuffle_buffer,
        "index": index_id(loader),
    }
    if pos.earlier and plan.remainder is not None and plan.remainder[0] == epoch:
        state["stages"] = [stage.as_dict() for stage in pos.earlier]  # how it came to be
    return state


def load_state_dict(loader: Any, state: dict[str, Any]) -> None:
    """`Loader.load_state_dict()`: check `state` against this loader, then aim its next
    iteration at the batches not yet delivered (closing it where the plan changes)."""
    if not isinstance(state, dict):
        raise OptionError(
            f"loader state is a {type(state).__name__}, not a dict: pass what "
            "Loader.state_dict() returned"
        )
    mine = state_dict(loader)
    for key in (*STATE_KEYS, "epoch", "batch"):
        if key not in state:
            raise OptionError(
                f"loader state has no {key!r}; pass what Loader.state_dict() returned "
                "(states saved by gpufeed before 0.2 cannot be resumed)"
            )
    for key in (*STATE_KEYS, *(k for k in ORDER_KEYS if k in state)):
        if state[key] != mine[key] and key not in COUNT_KEYS:
            raise OptionError(
                f"loader state was saved with {key}={state[key]!r} but this loader has "
                f"{mine[key]!r}; resume with the same {key}"
            )
    for key in ("epoch", "batch"):
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OptionError(
                f"loader state {key}={value!r} is not a count (a whole number >= 0): pass "
                "what Loader.state_dict() returned"
            )
    resumed = resume(state, loader.plan, loader.cluster is None)
    if resumed.plan is not loader.plan:  # an epoch's remainder: its workers take the new plan
        if loader._feeder is not None:
            loader.close()
        loader.plan = resumed.plan
    loader._pos.earlier, loader._pos.next = resumed.earlier, resumed.at
