"""The step recorder: step semantics, bounded memory, and a store that cannot be written."""

from __future__ import annotations

import time

import pytest

from gpufeed.profiler.batches import batch_size
from gpufeed.profiler.steps import Recorder
from gpufeed.profiler.store import read_store


@pytest.fixture
def recorder(tmp_path):
    rec = Recorder(tmp_path / "steps.db", {"host": "h", "rank": 0, "pid": 1})
    yield rec
    rec.close()


def _steps(rec: Recorder) -> list[tuple]:
    rec.flush()
    return read_store(rec.path)["steps"]


def test_a_step_spans_from_the_previous_step_end_and_includes_its_data_wait(recorder):
    now = time.perf_counter()
    recorder.on_batch(now - 0.3, now, [[0] * 8])  # blocked 0.3 s; not a tensor: samples unknown
    recorder.end_step(None)
    now = time.perf_counter()
    recorder.on_batch(now - 0.1, now - 0.05, (FakeTensor(4), None))
    recorder.on_batch(now - 0.05, now, {"image": FakeTensor(4)})  # gradient accumulation
    recorder.on_optimizer_step(Opt())
    (i0, s0, e0, w0, n0, _), (i1, s1, e1, w1, n1, g1) = _steps(recorder)
    assert (i0, i1) == (0, 1)
    assert w0 == pytest.approx(0.3) and e0 - s0 >= w0 and n0 is None
    assert s1 == e0  # the second step starts where the first ended
    assert w1 == pytest.approx(0.1) and n1 == 8 and e1 >= s1
    assert g1 is None  # no CUDA: no GPU time


def test_the_cpu_used_across_a_steps_training_waits_is_stored_with_it(recorder):
    now = time.perf_counter()
    recorder.on_iter_start(now - 0.5, now - 0.4, None, cpu=0.05)  # worker start-up: input time
    recorder.on_batch(now - 0.4, now - 0.2, FakeTensor(4), None, cpu=0.15)
    recorder.on_batch(now - 0.2, now, FakeTensor(4), None, cpu=0.2)
    recorder.on_optimizer_step(Opt())
    recorder.on_batch(now, now + 0.1, FakeTensor(4), None)  # not measured: the step's CPU unknown
    recorder.on_optimizer_step(Opt())
    recorder.flush()
    data = read_store(recorder.path)
    assert [w for *_, w, _, _ in data["steps"]] == pytest.approx([0.5, 0.1])
    ((step, cpu, ready),) = data["cpu_phases"]
    assert step == 0 and cpu == pytest.approx(0.4)
    assert ready is None  # given as seconds of CPU: the wait for a core is not known


class Opt:
    """A stand-in optimizer object: the hook only needs its identity."""


class FakeTensor:
    def __init__(self, n: int) -> None:
        self.shape = (n, 3)


def test_only_the_first_optimizer_to_step_marks_steps(recorder):
    d, g = Opt(), Opt()
    for _ in range(3):
        recorder.on_optimizer_step(d)
        recorder.on_optimizer_step(g)
    assert len(_steps(recorder)) == 3


def test_explicit_steps_take_over_from_the_optimizer_hook(recorder):
    opt = Opt()
    recorder.mark_step(samples=16)
    recorder.on_optimizer_step(opt)
    recorder.mark_step(samples=16)
    rows = _steps(recorder)
    assert [r[4] for r in rows] == [16, 16]


def test_a_mark_right_after_the_optimizer_hook_ended_the_step_adds_no_step(recorder):
    # the loop of docs/getting-started/see.md: train_step(batch) calls opt.step(), then
    # gpufeed.step(samples=8)
    opt = Opt()
    for _ in range(5):
        now = time.perf_counter()
        recorder.on_batch(now - 0.01, now, FakeTensor(8), None)
        recorder.on_optimizer_step(opt)
        recorder.mark_step(samples=8)
    rows = _steps(recorder)
    assert len(rows) == 5 and [r[4] for r in rows] == [8] * 5  # was 6: a 0-length step 1


def test_a_mark_after_several_optimizers_stepped_adds_no_step_either(recorder):
    d, g = Opt(), Opt()  # a GAN: the first optimizer to step ends the steps
    for _ in range(5):
        now = time.perf_counter()
        recorder.on_batch(now - 0.01, now, FakeTensor(8), None)
        recorder.on_optimizer_step(d)
        recorder.on_optimizer(now, now)
        recorder.on_optimizer_step(g)
        recorder.mark_step(samples=8)
    assert len(_steps(recorder)) == 5


def test_the_first_step_without_a_known_start_has_no_duration(recorder):
    recorder.end_step(None)
    ((_, start, end, *_),) = _steps(recorder)
    assert start is None and end > 0  # NaN is stored as NULL


def test_memory_is_bounded_and_overflow_is_counted(tmp_path):
    rec = Recorder(tmp_path / "s.db", {"host": "h"}, capacity=10, flush_interval=60)
    for _ in range(25):
        rec.end_step(None)
    assert rec.dropped == 15
    rec.close()
    data = read_store(tmp_path / "s.db")
    assert len(data["steps"]) == 10 and data["info"]["dropped_events"] == 15


def test_an_unwritable_store_drops_events_warns_once_and_never_raises(tmp_path, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rec = Recorder(blocker / "steps.db", {"host": "h"}, flush_interval=0.05)
    for _ in range(5):
        rec.end_step(4)
        time.sleep(0.06)
    rec.close()
    err = capsys.readouterr().err
    assert err.count("cannot write profile store") == 1
    assert rec.dropped == 5 and "5 profiler events were dropped" in err


def test_the_flush_thread_writes_without_being_asked(tmp_path):
    rec = Recorder(tmp_path / "s.db", {"host": "h"}, flush_interval=0.05)
    rec.end_step(1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (tmp_path / "s.db").exists():
        time.sleep(0.02)
    time.sleep(0.2)
    assert len(read_store(tmp_path / "s.db")["steps"]) == 1
    rec.close()
    assert read_store(tmp_path / "s.db")["info"]["end"] > 0


@pytest.mark.parametrize(
    ("batch", "n"),
    [
        (FakeTensor(7), 7),
        ([FakeTensor(3), FakeTensor(9)], 3),
        ({"x": (FakeTensor(5),)}, 5),
        ([], None),
        ("text", None),
    ],
)
def test_batch_size_is_the_leading_dim_of_the_first_tensor(batch, n):
    assert batch_size(batch) == n


def test_recording_a_step_costs_microseconds(recorder):
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        recorder.on_batch(0.0, 0.0, None)
        recorder.end_step(None)
    per_event = (time.perf_counter() - t) / (2 * n)
    assert per_event < 50e-6  # generous bound on a shared machine; the benchmark prints the figure


def test_a_closures_forward_and_backward_inside_the_optimizer_step_are_not_optimizer_time():
    from gpufeed.profiler.phases import split_step

    model = 7
    # opt.step(closure) from 1.0 to 2.0; inside it the closure's forward and backward; GPU marks
    # named after the moment they were taken
    events = [
        ("f", 0.0, 0.5, 4, 1, False),
        ("F", 1.1, 1.4, 4, model, True, True, "g1.1", "g1.4"),
        ("B", 1.5, 1.9, "g1.5", "g1.9"),
        ("O", 1.0, 2.0, "g1.0", "g2.0"),
    ]
    parts = split_step(0.0, events, frozenset({model}), set())
    assert (parts.data_wait, parts.forward, parts.backward) == pytest.approx((0.5, 0.3, 0.4))
    assert parts.optimizer == pytest.approx(0.3)  # 1.0-1.1, 1.4-1.5, 1.9-2.0
    optimizer = [(b, e) for name, b, e in parts.gpu if name == "optimizer"]
    assert optimizer == [("g1.0", "g1.1"), ("g1.4", "g1.5"), ("g1.9", "g2.0")]
    # a forward inside the step without GPU marks: its GPU time cannot be taken out, none is kept
    events[1] = ("F", 1.1, 1.4, 4, model, True, True, None, None)
    parts = split_step(0.0, events, frozenset({model}), set())
    assert [s for s in parts.gpu if s[0] == "optimizer"] == []
