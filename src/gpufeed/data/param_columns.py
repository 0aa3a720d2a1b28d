"""The per-image parameters a slot carries, by name: each augmentation op declares the columns it
draws (`Augment.drawn_columns`), and one `ParamLayout` packs them into a slot's float64 rows and
unpacks them on the other side, so no stage counts or slices columns by position."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("int", "bool", "float")


@dataclass(frozen=True)
class Column:
    """`width` columns named `name` per image, holding `kind` values (stored as float64)."""

    name: str
    width: int
    kind: str = "float"

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.width < 0:
            raise ValueError(f"Column {self.name!r}: kind one of {KINDS}, width ≥ 0")


@dataclass(frozen=True)
class ParamLayout:
    """Columns side by side in a slot's N × `width` float64 parameter rows."""

    columns: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"ParamLayout: a column named twice in {names}")

    @property
    def width(self) -> int:
        """Float64 columns per image."""
        return sum(c.width for c in self.columns)

    @functools.cached_property
    def _spans(self) -> dict[str, tuple[int, int, Column]]:
        spans, at = {}, 0
        for c in self.columns:
            spans[c.name] = (at, at + c.width, c)
            at += c.width
        return spans

    def pack(self, out: np.ndarray, values: Mapping[str, Any]) -> None:
        """Write `values` (name → N × width, or N for width 1) into `out`'s first N rows; every
        column, and no other, must be given, each with N rows."""
        spans = self._spans
        if set(values) != set(spans):
            raise ValueError(
                f"slot parameters: got {sorted(values)}, the layout holds {sorted(spans)}"
            )
        n = None
        for name, (a, b, c) in spans.items():
            v = np.asarray(values[name], dtype=np.float64)
            if v.size == 0:
                v = v.reshape(len(v) if v.ndim else 0, c.width)
            elif v.ndim == 1 and c.width == 1:
                v = v[:, None]
            if v.ndim != 2 or v.shape[1] != c.width:
                raise ValueError(f"slot parameter {name!r}: shape {v.shape}, not N × {c.width}")
            n = len(v) if n is None else n
            if len(v) != n:
                raise ValueError(f"slot parameter {name!r}: {len(v)} images, not {n}")
            out[:n, a:b] = v

    def unpack(self, rows: Any) -> dict[str, Any]:
        """name → the N × width view of `rows` (a tensor or an array) holding that column."""
        if rows.shape[1] != self.width:
            raise ValueError(
                f"slot parameters: {rows.shape[1]} columns, the layout has {self.width}"
            )
        return {name: rows[:, a:b] for name, (a, b, _) in self._spans.items()}
