"""Clocks for step phases: the host clock, the CUDA-event clock's pool, and the bookkeeping that reads
a step's marks only once all of them are done (driven here by clocks whose readiness the test sets)."""

from __future__ import annotations

import math
import textwrap
import time

import numpy as np
import pytest
import torch

import gpufeed
from gpufeed.analysis.stats import step_summary
from gpufeed.profiler.clocks import CudaClock, HostClock, Spans
from gpufeed.profiler.steps import Recorder
from gpufeed.profiler.store import read_store


class ManualClock:
    """Marks are numbers (seconds); a mark is ready once the test has moved `done` past it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.done = -1.0
        self.released: list[float] = []
        self.broken: set[float] = set()

    def mark(self) -> float:
        self.now += 1.0
        return self.now

    def ready(self, mark: float) -> bool:
        return mark <= self.done

    def seconds(self, begin: float, end: float) -> float:
        if begin in self.broken or end in self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return end - begin

    def release(self, mark: float) -> None:
        self.released.append(mark)


class ToyEvent:
    """Stands for a `torch.cuda.Event`: records the toy stream's position, done once it has run."""

    def __init__(self, stream: ToyCuda) -> None:
        self.stream = stream
        self.at = -1.0

    def record(self) -> None:
        self.stream.position += 0.001
        self.at = self.stream.position

    def query(self) -> bool:
        return self.at <= self.stream.ran

    def elapsed_time(self, end: ToyEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an unfinished event"
        return (end.at - self.at) * 1000.0


class ToyCuda:
    """`torch.cuda` as the recorder uses it: a stream the test lets run up to a position."""

    def __init__(self) -> None:
        self.position = 0.0
        self.ran = -1.0
        self.created = 0

    def Event(self, enable_timing: bool = False) -> ToyEvent:
        assert enable_timing
        self.created += 1
        return ToyEvent(self)

    def run_all(self) -> None:
        self.ran = self.position


def test_the_host_clock_is_ready_at_once_and_reads_perf_counter_seconds():
    clock = HostClock()
    a = clock.mark()
    time.sleep(0.01)
    b = clock.mark()
    assert clock.ready(a) and clock.ready(b)
    assert clock.seconds(a, b) >= 0.01
    spans = Spans(clock)
    spans.add(0, [("forward", a, b)], [a, b])
    assert spans.resolve() == [(0, {"forward": b - a})]


def test_steps_are_read_in_order_and_only_once_every_mark_is_done():
    clock = ManualClock()
    spans = Spans(clock)
    for step in range(3):
        m = [clock.mark() for _ in range(6)]
        names = [("step", m[0], m[5]), ("forward", m[1], m[2]), ("backward", m[3], m[4])]
        spans.add(step, [*names, ("forward", m[1], m[2])], m)
    assert spans.resolve() == [] and len(spans) == 3
    clock.done = 8.0  # step 0 is done, step 1 half done
    assert spans.resolve() == [(0, {"step": 5.0, "forward": 2.0, "backward": 1.0})]
    clock.done = 18.0
    assert [step for step, _ in spans.resolve()] == [1, 2]
    assert len(spans) == 0


def test_a_shared_mark_is_given_back_only_after_the_next_step_was_read():
    clock = ManualClock()
    spans = Spans(clock)
    a, b, c = clock.mark(), clock.mark(), clock.mark()
    spans.add(0, [("step", a, b)], [a, b])
    spans.add(1, [("step", b, c)], [c, c])  # starts at step 0's end; lists its own mark twice
    clock.done = 2.0
    assert spans.resolve() == [(0, {"step": 1.0})]
    assert clock.released == []  # b is still step 1's start
    clock.done = 3.0
    assert spans.resolve() == [(1, {"step": 1.0})]
    assert clock.released == [a, b]
    spans.add(2, [], [])
    spans.resolve()
    assert clock.released == [a, b, c]  # once each


def test_past_the_cap_the_oldest_steps_are_dropped_counted_and_their_marks_reused():
    clock = ManualClock()
    spans = Spans(clock, capacity=4)
    for step in range(10):
        a, b = clock.mark(), clock.mark()
        spans.add(step, [("step", a, b)], [a, b])
    assert len(spans) == 4 and spans.dropped == 6
    assert len(clock.released) == 10  # the first five dropped gave theirs back; the sixth holds
    clock.done = math.inf
    assert [step for step, _ in spans.resolve()] == [6, 7, 8, 9]


def test_a_mark_that_cannot_be_read_leaves_its_step_unmeasured_and_never_raises():
    clock = ManualClock()
    spans = Spans(clock)
    a, b, c, d = (clock.mark() for _ in range(4))
    clock.broken.add(b)
    spans.add(0, [("forward", a, b)], [a, b])
    spans.add(1, [("forward", c, d), ("backward", None, d)], [c, d])
    clock.done = 4.0
    assert spans.resolve() == [(0, {}), (1, {"forward": 1.0})]


def test_the_cuda_clock_reuses_its_events_and_stops_at_its_cap():
    cuda = ToyCuda()
    clock = CudaClock(cuda, capacity=3)
    marks = [clock.mark() for _ in range(3)]
    assert clock.mark() is None  # at the cap: that span goes unmeasured, nothing is allocated
    assert not clock.ready(marks[0])
    cuda.run_all()
    assert clock.ready(marks[0]) and clock.seconds(marks[0], marks[2]) == pytest.approx(0.002)
    for m in marks:
        clock.release(m)
    for _ in range(100):
        clock.release(clock.mark())
    assert cuda.created == 3


class _Optimizer:
    param_groups = ()


def _train_steps(rec: Recorder, n: int) -> None:
    """What the hooks report for n steps of a model (GPU marks where it is on a GPU): batch,
    forward, backward, optimizer step."""
    opt = _Optimizer()
    for _ in range(n):
        t = time.perf_counter()
        rec.on_batch(t, t + 0.001, None)
        g = [rec.gpu_mark() if rec.gpu_phases else None for _ in range(6)]
        rec.on_forward(1, t + 0.001, t + 0.002, 8, True, True, g[0], g[1])
        rec.on_backward(t + 0.002, t + 0.004, g[2], g[3])
        rec.on_optimizer(t + 0.004, t + 0.005, g[4], g[5])
        rec.on_optimizer_step(opt)


def test_gpu_phases_are_written_once_their_events_are_done_from_a_bounded_pool(tmp_path):
    cuda = ToyCuda()
    rec = Recorder(tmp_path / "steps-h-1.db", {"host": "h", "pid": 1}, flush_interval=3600)
    rec._cuda, rec.models, rec.gpu_phases = cuda, frozenset({1}), True  # as the hooks set them
    try:
        _train_steps(rec, 5)
        rec.flush()  # nothing has run on the "GPU" yet: no GPU figures, no wait
        data = read_store(rec.path)
        assert len(data["steps"]) == 5 and data["gpu_phases"] == []
        assert all(s[5] is None for s in data["steps"])
        cuda.run_all()
        rec.flush()
        made = cuda.created
        for _ in range(20):  # steady state: each flush's events go back to the pool
            _train_steps(rec, 5)
            cuda.run_all()
            rec.flush()
        assert cuda.created <= made + 8
    finally:
        rec.close(gpu_wait=0.1)
    run = gpufeed.load(tmp_path)
    steps = run.steps
    assert len(steps) == 105
    # Each phase spans two records of the toy stream (1 ms apart per record).
    for phase in ("gpu_forward", "gpu_backward", "gpu_optimizer"):
        assert steps[phase].to_numpy() == pytest.approx(0.001)
    assert (steps["gpu_time"] > steps[["gpu_forward", "gpu_backward"]].sum(axis=1)).all()
    assert steps["forward"].to_numpy() == pytest.approx(0.001, abs=1e-6)  # host clock kept
    assert run.meta["dropped_events"] == 0


def test_gpu_phases_stay_empty_where_the_model_is_not_on_a_gpu(tmp_path):
    rec = Recorder(tmp_path / "steps-h-1.db", {"host": "h", "pid": 1}, flush_interval=3600)
    rec.models = frozenset({1})
    _train_steps(rec, 3)
    rec.close()
    steps = gpufeed.load(tmp_path).steps
    assert steps[["gpu_time", "gpu_forward", "gpu_backward", "gpu_optimizer"]].isna().all().all()
    assert steps["backward"].to_numpy() == pytest.approx(0.002, abs=1e-6)


# A small conv net trained on CUDA under `gpufeed.profile()` (run under `gpufeed profile`, which it
# joins), with torch raising on any host sync (the data is made on the GPU first: copying it there
# would be the loop's own sync).
CUDA_CONV_LOOP = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    import gpufeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs = torch.randn(8, 32, 3, 64, 64, device="cuda")
    ys = torch.randint(0, 10, (8, 32), device="cuda")
    with gpufeed.profile(interval=0.1):
        torch.cuda.set_sync_debug_mode("error")
        try:
            for epoch in range(4):
                for x, y in zip(xs, ys):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    """
)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_model_gets_gpu_phases_from_events_without_any_host_sync(run_profiled):
    cp, run_dir = run_profiled(CUDA_CONV_LOOP, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]  # a host sync would have raised in the loop
    run = gpufeed.load(run_dir)
    steps = run.steps
    assert len(steps) == 32 and run.meta["dropped_events"] == 0
    # The first optimizer step finds the model; every later step has its phases on the GPU clock.
    later = steps.iloc[1:]
    gpu = later[["gpu_forward", "gpu_backward", "gpu_optimizer"]].to_numpy(dtype=float)
    assert np.isfinite(gpu).all() and (gpu > 0).all()
    steady = later.iloc[8:]  # past the first epoch's warm-up (cuDNN picks its kernels)
    work = steady[["gpu_forward", "gpu_backward", "gpu_optimizer"]].sum(axis=1)
    assert (work < steady["duration"]).all()
    assert (steady["gpu_time"] >= 0.99 * work).all()  # the step's GPU span holds its phases
    assert step_summary(run)["phase_clock"] == "cuda"
