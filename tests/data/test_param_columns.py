"""A slot's per-image parameters go in and come out by name, in the columns the ops declare; a
column missing, unknown or of the wrong width is an error, never a silent shift."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from gpufeed.data.augment import Augment
from gpufeed.data.param_columns import Column, ParamLayout
from gpufeed.data.placement import Placement
from gpufeed.data.slot_meta import SlotMeta
from gpufeed.data.spec import BatchSpec

LAYOUT = ParamLayout((Column("size", 2, "int"), Column("flip", 1, "bool"), Column("m", 3)))


def test_what_is_packed_unpacks_by_name():
    out = np.zeros((4, LAYOUT.width))
    LAYOUT.pack(out, {"size": [(5, 6), (7, 8)], "flip": [True, False], "m": np.ones((2, 3))})
    got = LAYOUT.unpack(torch.from_numpy(out)[:2])
    assert got["size"].tolist() == [[5, 6], [7, 8]]
    assert got["flip"].tolist() == [[1.0], [0.0]]
    assert got["m"].tolist() == [[1.0] * 3] * 2
    assert out[2:].sum() == 0  # rows past the batch untouched


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"size": [(1, 2)], "flip": [1]}, "the layout holds"),
        ({"size": [(1, 2)], "flip": [1], "m": [(0, 0, 0)], "x": [1]}, "the layout holds"),
        ({"size": [(1, 2, 3)], "flip": [1], "m": [(0, 0, 0)]}, "'size': shape"),
        ({"size": [(1, 2), (3, 4)], "flip": [1], "m": [(0, 0, 0)] * 2}, "'flip': 1 images, not 2"),
    ],
)
def test_a_wrong_column_is_an_error(values: dict, error: str):
    with pytest.raises(ValueError, match=error):
        LAYOUT.pack(np.zeros((4, LAYOUT.width)), values)


def test_a_column_named_twice_is_refused():
    with pytest.raises(ValueError, match="named twice"):
        ParamLayout((Column("a", 1), Column("a", 2)))


def test_rows_of_another_width_are_refused():
    with pytest.raises(ValueError, match="7 columns, the layout has 6"):
        LAYOUT.unpack(np.zeros((2, 7)))


@pytest.mark.parametrize(("train", "reps"), [(True, 3), (False, 0)])
def test_an_encoded_slot_carries_each_size_and_what_the_augmentation_draws(train: bool, reps: int):
    aug = Augment.load_factor(3, train=train)
    spec = BatchSpec(8, aug, Placement.of("encoded"), torch.float32, False, False, 100)
    names = [(c.name, c.width) for c in spec.params.columns]
    assert names == [("size", 2), ("box", 4), ("hflip", reps), ("vflip", reps), ("angle", reps)]
    assert spec.param_columns == 6 + 3 * reps


@pytest.mark.parametrize(("fused", "width"), [(False, 12), (True, 0)])
def test_a_first_pass_slot_carries_the_warps_after_the_first(fused: bool, width: int):
    aug = Augment.load_factor(3, fused=fused)
    spec = BatchSpec(8, aug, Placement.of("first_pass"), torch.float32, False, False, 100)
    assert [(c.name, c.width) for c in spec.params.columns] == [("warps", width)]


def test_a_decoded_slot_carries_no_parameters():
    spec = BatchSpec(8, Augment(), Placement.of("decoded"), torch.float32, False, False, 100)
    assert spec.params.columns == () and spec.param_columns == 0


def test_slot_meta_crosses_a_process_boundary_and_cannot_be_changed_on_the_way():
    meta = SlotMeta(3, corrupt=(("s.tar", "k", "truncated"),), keys=(("s.tar", "k"),), bad={1: "x"})
    assert pickle.loads(pickle.dumps(meta)) == meta
    with pytest.raises(AttributeError):
        meta.n = 4  # type: ignore[misc]
