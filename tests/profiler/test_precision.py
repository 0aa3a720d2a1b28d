"""Training precision: autocast and parameter dtypes seen without code changes, merged over ranks."""

from __future__ import annotations

import pytest
import torch

import gpufeed
from gpufeed.profiler.sampler import compute_capability
from gpufeed.profiler.session import steps_store_path, write_meta
from gpufeed.profiler.steps import Recorder, param_precision
from gpufeed.profiler.store import Store, read_store

# A small real training loop; argv[1] picks how (and whether) it uses low precision.
TRAIN = """
import sys, torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

mode = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
dtype = torch.bfloat16 if mode == "bf16-params" else torch.float32
model = model.to(dtype)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,))), batch_size=16)

def forward(x, y):
    if mode == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        assert out.dtype == torch.bfloat16
        return F.cross_entropy(out.float(), y)
    return F.cross_entropy(model(x.to(dtype)).float(), y)

def epoch():
    for x, y in loader:
        forward(x, y).backward()
        opt.step()
        opt.zero_grad()

if mode == "loop-in-autocast":  # one autocast region around all of training
    with torch.autocast("cpu", dtype=torch.bfloat16):
        epoch()
else:
    epoch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(8, 32))  # a bf16 evaluation after training never decides it
"""


@pytest.mark.parametrize(
    ("mode", "precision"),
    [
        ("fp32", "fp32"),
        ("autocast", "bf16"),
        ("loop-in-autocast", "bf16"),
        ("bf16-params", "bf16"),
    ],
)
def test_a_profiled_script_records_the_precision_it_trained_in(run_profiled, mode, precision):
    cp, run_dir = run_profiled(TRAIN, mode)
    assert cp.returncode == 0, cp.stderr
    run = gpufeed.load(run_dir)
    assert len(run.steps) >= 16
    assert run.meta["precision"] == precision
    assert [r["precision"] for r in run.meta["ranks"]] == [precision]


def _rank_store(run_dir, pid: int, precision: str | None) -> None:
    store = Store(steps_store_path(run_dir, "h1", pid))
    info = {"host": "h1", "rank": pid - 100, "local_rank": pid - 100, "world_size": 2, "pid": pid}
    store.write({**info, **({"precision": precision} if precision else {})})
    store.close()


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [(["bf16", "bf16"], "bf16"), (["bf16", "fp32"], "mixed"), (["fp16", None], "fp16")],
)
def test_load_merges_the_ranks_precisions(tmp_path, ranks, expected):
    write_meta(tmp_path, {"name": "t", "start_time": 1.0, "end_time": 2.0})
    for i, precision in enumerate(ranks):
        _rank_store(tmp_path, 100 + i, precision)
    assert gpufeed.load(tmp_path).meta["precision"] == expected


def test_no_rank_that_showed_a_precision_means_no_precision(tmp_path):
    write_meta(tmp_path, {"name": "t", "start_time": 1.0, "end_time": 2.0})
    _rank_store(tmp_path, 100, None)
    meta = gpufeed.load(tmp_path).meta
    assert "precision" not in meta and meta["ranks"][0]["precision"] is None


def test_parameter_precision_is_the_dtype_of_most_parameter_elements():
    def params(*dtypes_and_sizes):
        return [torch.nn.Parameter(torch.zeros(n, dtype=d)) for d, n in dtypes_and_sizes]

    mostly_fp16 = params((torch.float16, 100), (torch.float32, 10))
    assert param_precision(torch.optim.SGD(mostly_fp16, lr=0.1)) == "fp16"
    mostly_fp32 = params((torch.bfloat16, 10), (torch.float32, 100))
    assert param_precision(torch.optim.SGD(mostly_fp32, lr=0.1)) == "fp32"
    empty = type("Opt", (), {"param_groups": [{"params": []}]})()
    assert param_precision(empty) is None


def test_steps_count_as_autocast_while_a_region_is_entered_in_or_spans_them(tmp_path):
    rec = Recorder(tmp_path / "s.db", {"host": "h"}, flush_interval=3600)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
    rec.on_optimizer_step(opt)
    assert rec.precision() == "fp32"  # the parameters' dtype, no autocast yet
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rec.autocast = ("cpu", torch.bfloat16)  # what the autocast hook does on entry
        rec.on_optimizer_step(opt)
        rec.on_optimizer_step(opt)  # a region still entered at a step's end spans the next one
    rec.on_optimizer_step(opt)  # began inside the region, ended after it
    assert rec.autocast is None and rec.precision() == "bf16"  # 3 of 4 steps
    for _ in range(3):
        rec.on_optimizer_step(opt)
    assert rec.precision() == "fp32"  # 3 of 7: autocast was used, but not for training
    rec.close()
    assert read_store(rec.path)["info"]["precision"] == "fp32"


class StandInNvml:
    """NVML's compute-capability call as a recent driver answers it, or as an old one fails."""

    def __init__(self, answer: tuple[int, int] | None) -> None:
        self.answer = answer

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        if self.answer is None:
            raise NVMLError_FunctionNotFound("function not found")
        return self.answer


class NVMLError_FunctionNotFound(Exception):
    pass


def test_compute_capability_is_major_dot_minor_or_absent():
    # NVML cannot run without a driver; the reading and its guard are checked with a stand-in.
    assert compute_capability(StandInNvml((8, 0)), 0) == "8.0"
    assert compute_capability(StandInNvml((12, 1)), 0) == "12.1"
    assert compute_capability(StandInNvml(None), 0) is None
