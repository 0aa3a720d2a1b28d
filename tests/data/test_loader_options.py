"""The Loader's options, checked when the loader is made: on/off options, counts, devices and
datasets that cannot work are refused naming the option; whole numbers in other forms are taken;
a loader refuses to be pickled.

Sizes, memory caps and timeouts: test_loader_option_errors.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from loader_helpers import MakeLoader

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.errors import GpufeedError, OptionError


@pytest.mark.parametrize(
    ("option", "value"),
    [("drop_last", "False"), ("shuffle", "False"), ("strict", "no"), ("channels_last", 0)],
)
def test_on_off_options_given_as_text_are_refused(shards: Path, option: str, value: Any):
    # drop_last="False" (a YAML or argparse string) dropped the last batch: read as True
    with pytest.raises(OptionError, match=rf"{option} must be True or False, got {value!r}"):
        Loader(shards, 4, num_workers=0, device="cpu", **{option: value})


def test_unknown_preprocess_mode_is_refused(shards: Path):
    with pytest.raises(ValueError, match="preprocess='tpu': choose one of cpu, gpu, auto"):
        Loader(shards, preprocess="tpu")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("batch_size", "8"),
        ("batch_size", 0),
        ("num_workers", -1),
        ("num_workers", 2.5),
        ("prefetch", 0),
    ],
)
def test_a_bad_count_is_refused_naming_the_option(shards: Path, option: str, value: object):
    with pytest.raises(OptionError, match=rf"{option} must be an integer >= \d, got {value!r}"):
        Loader(shards, **{"batch_size": 4, option: value})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"seed": 1.5}, "seed must be an integer >= 0, got 1.5"),
        ({"world_size": "2"}, "world_size must be an integer >= 1, got '2'"),
        ({"retries": -1}, "retries must be an integer >= 0, got -1"),
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1, got 0"),
        ({"worker_nice": "x"}, "worker_nice must be an integer >= -20, got 'x'"),
        ({"dtype": torch.int32}, "dtype=torch.int32: give one of torch.float32,"),
        ({"dtype": "float16"}, "dtype='float16': give one of torch.float32,"),
        ({"decoder": "bogus"}, "decoder='bogus': choose one of auto, dali,"),
        ({"augment": "yes"}, "augment='yes': give a gpufeed.data.Augment"),
        ({"pin_memry": True}, "Loader has no option 'pin_memry': did you mean 'pin_memory'?"),
        ({"persistent_workers": True}, "Loader has no option 'persistent_workers'"),
    ],
)
def test_an_option_that_cannot_work_is_refused_when_the_loader_is_made(
    shards: Path, options: dict, message: str
):
    # each used to pass, then fail at the first batch or deep inside with a torch/numpy error
    with pytest.raises(OptionError, match=re.escape(message)):
        Loader(shards, 4, num_workers=0, device="cpu", **options)


def test_whole_numbers_in_other_forms_are_taken_and_kept_as_ints(shards: Path):
    loader = Loader(
        shards, np.int64(4), num_workers=np.int64(0), device="cpu", worker_nice=None, seed=2.0
    )
    loader.set_epoch(torch.tensor(1))
    next(iter(loader))
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain ints: a checkpoint can hold it
    assert type(loader.batch_size) is int and loader.dataset.seed == 2 and state["epoch"] == 1


def test_set_epoch_takes_a_whole_epoch_number(shards: Path):
    loader = Loader(shards, 4, num_workers=0, device="cpu")
    for bad in (-1, 1.5, "2"):
        with pytest.raises(
            OptionError, match=rf"set_epoch's epoch must be an integer >= 0, got {bad!r}"
        ):
            loader.set_epoch(bad)
    loader.set_epoch(np.int64(3))  # a numpy integer is a whole number
    assert next(iter(loader))[0].shape[0] == 4 and loader.state_dict()["epoch"] == 3


def test_drop_last_with_a_ready_made_dataset_that_pads_its_ranks_is_refused(shards: Path):
    # the padded share would be delivered with its repeated samples
    total = len(ShardDataset(shards, world_size=1))
    uneven = next(w for w in range(2, total) if total % w)
    even = next(w for w in range(2, total) if total % w == 0)
    padded = ShardDataset(shards, rank=0, world_size=uneven)
    with pytest.raises(OptionError, match=r"ShardDataset\(\.\.\., drop_last=True\)"):
        Loader(padded, 4, num_workers=0, device="cpu", drop_last=True)
    dropped = ShardDataset(shards, rank=0, world_size=uneven, drop_last=True)
    assert len(Loader(dropped, 4, num_workers=0, device="cpu", drop_last=True)) > 0
    divided = ShardDataset(shards, rank=0, world_size=even)  # nothing to pad: taken as it is
    assert len(Loader(divided, 4, num_workers=0, device="cpu", drop_last=True)) > 0


def test_a_batch_larger_than_the_epoch_with_drop_last_is_a_gpufeed_error(shards: Path):
    with pytest.raises(GpufeedError, match="batch_size"):
        Loader(shards, 1000, drop_last=True, device="cpu")


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "device='tpu': not a device PyTorch knows; pass 'cuda', 'cuda:N' or 'cpu'"),
        ("cuda", "device='cuda': PyTorch sees no CUDA GPU on this machine; pass device='cpu'"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_when_the_loader_is_made(
    shards: Path, device: str, message: str
):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(OptionError, match=re.escape(message)):
        Loader(shards, 4, device=device)


def test_a_loader_refuses_to_be_pickled_or_copied_saying_to_make_it_where_it_runs(
    shards: Path, make: MakeLoader
):
    import copy
    import pickle

    loader = make(shards, 8, num_workers=1)
    for how in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(
            TypeError, match=r"cannot be pickled or copied.*Create it in the process"
        ):
            how(loader)
    assert sum(len(y) for _, y in loader) == 48  # still whole after the attempts
