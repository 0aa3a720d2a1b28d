"""`SlotMeta`: what a worker sends with a filled slot, besides the slot itself. It crosses a
process boundary (a pipe, or Ray) pickled, so its fields are plain values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Corrupt = tuple[str, str, str]  # (shard, key, why) of a sample left out


@dataclass(frozen=True)
class SlotMeta:
    """A filled slot's description: `n` samples in it; `corrupt` samples left out; for "encoded"
    slots each sample's (shard, key) and the images the device must not decode (`bad`: index →
    why); with `extras=` each sample's (shard, key, values); the remote reads `retried`; the
    seconds a Ray actor took (for its deadline)."""

    n: int
    corrupt: tuple[Corrupt, ...] = ()
    keys: tuple[tuple[str, str], ...] = ()
    bad: dict[int, str] = field(default_factory=dict)
    extras: tuple[tuple[str, str, tuple[Any, ...]], ...] | None = None
    retried: int = 0
    seconds: float = 0.0
