"""A step's events split into its phases: data wait, forward, backward, optimizer, evaluation.

Runs on the recorder's flush thread, never in the training thread. The events are what the hooks
appended in order (see `split_step`); the result is one `StepParts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpufeed.profiler.threadclock import between

NAN = math.nan


@dataclass
class StepParts:
    """One training step split into phases (host seconds; NaN where not measured), the training
    thread's seconds on a CPU and ready for one (runnable, kept off a core) while it waited on
    data, the evaluation pass found among its events, if any: (start, end, batches, samples,
    data_wait), and the GPU clock's marks of its training phases: (phase, begin, end)."""

    start: float
    data_wait: float
    data_wait_cpu: float
    data_wait_ready: float
    samples: float
    forward: float
    backward: float
    optimizer: float
    evaluation: tuple[float, float, int, float, float] | None
    gpu: list[tuple[str, Any, Any]]


def split_step(
    start: float,
    events: list[tuple],
    models: frozenset[int] | None,
    eval_iters: set[int],
    train_iters: set[int] | None = None,
) -> StepParts:
    """Split one step's events (in order) into phases and take evaluation out of it.

    Events: ("f", t0, t1, samples, iterator id[, True at the epoch's end[, the thread's CPU
    meanwhile: two `threadclock` readings or seconds]]) a batch fetched; ("F", t0, t1, samples,
    module id, grad enabled, module.training[, gpu begin, gpu end]) a forward of a root module;
    ("B", t0, t1[, gpu begin, gpu end]) a backward pass; ("O", t0, t1[, gpu begin, gpu end]) an
    optimizer step. `eval_iters` (evaluation iterators) is updated in place, and so is
    `train_iters` (those that fed training steps) when given.
    """
    forwards = [
        i for i, e in enumerate(events) if e[0] == "F" and models is not None and e[4] in models
    ]
    walk = _Walk(start, models, eval_iters, train_iters, _trained(events, forwards))
    fetch, forward, backward, optimizer = walk.fetch, walk.forward, walk.backward, walk.optimizer
    for i, e in enumerate(events):
        kind = e[0]
        if kind == "f":
            fetch(e)
        elif kind == "F":
            forward(i, e)
        elif kind == "B":
            backward(e)
        elif kind == "O":
            optimizer(events, i, e)
    return walk.parts(events, forwards)


def _trained(events: list[tuple], forwards: list[int]) -> set[int]:
    """Which of the model's `forwards` (indices into `events`) a backward pass follows before the
    next one: in eval() mode, a forward without one is evaluation."""
    out = set()
    for j, i in enumerate(forwards):
        nxt = forwards[j + 1] if j + 1 < len(forwards) else len(events)
        if any(events[k][0] == "B" for k in range(i + 1, nxt)):
            out.add(i)
    return out


class _Walk:
    """One step's running totals as `split_step` walks its events.

    A forward is evaluation when it runs without grad, or in eval() mode with no backward after
    it; the batches fetched before it, and every later batch of the same iterator, are evaluation
    too, and the step then starts where the evaluation ended."""

    __slots__ = (
        "backward_s", "eval", "eval_iters", "fetch_cpu", "fetch_known", "fetch_n",
        "fetch_ready", "fetch_wait", "fetched", "forward_s", "forwards", "fwd_known",
        "fwd_samples", "gap", "gpu", "mark", "models", "opt_seen", "optimizer_s", "pending",
        "primary", "since_mark", "start", "train_iters", "trained",
    )  # fmt: skip

    def __init__(
        self,
        start: float,
        models: frozenset[int] | None,
        eval_iters: set[int],
        train_iters: set[int] | None,
        trained: set[int],
    ) -> None:
        self.start, self.models, self.trained = start, models, trained
        self.eval_iters, self.train_iters = eval_iters, train_iters
        self.eval: list[Any] | None = None  # [t0, t1, batches, samples, wait]
        self.pending: list[tuple] = []  # fetches not yet known to feed training or evaluation
        self.fetch_wait = self.fetch_n = self.fetch_cpu = self.fetch_ready = 0.0
        self.fetched = self.fetch_known = False
        self.forward_s = self.backward_s = self.optimizer_s = 0.0
        self.forwards, self.opt_seen = 0, False
        self.fwd_samples, self.fwd_known, self.primary = 0.0, True, None
        self.gap, self.mark, self.since_mark = 0.0, start, 0.0  # host time no hook took
        self.gpu: list[tuple[str, Any, Any]] = []

    def fetch(self, e: tuple) -> None:
        if e[4] in self.eval_iters:
            self._to_eval(e[1], e[2], e[2] - e[1], 0, None)
            self.mark = max(self.mark, e[2])
        else:
            self.pending.append(e)

    def forward(self, i: int, e: tuple) -> None:
        models = self.models
        if models is None or e[4] not in models:
            return
        if not e[5] or (not e[6] and i not in self.trained):
            self._eval_forward(e)
            return
        self._fetches_trained(since=True)
        self.gap += max(0.0, e[1] - self.mark - self.since_mark)
        self.forward_s += e[2] - e[1]
        self.forwards += 1
        if len(e) > 7 and e[7] is not None:
            self.gpu.append(("forward", e[7], e[8]))
        if self.primary is None:
            self.primary = e[4]
        if e[4] == self.primary:  # samples: the first model's inputs (a GAN has two)
            if e[3] is None:
                self.fwd_known = False
            else:
                self.fwd_samples += e[3]
        self.mark, self.since_mark = max(self.mark, e[2]), 0.0

    def backward(self, e: tuple) -> None:
        if self.forwards:  # between forward and backward: nanoGPT fetches its next batch here
            self.gap += max(0.0, e[1] - self.mark - self.since_mark)
        self.backward_s += e[2] - e[1]
        self.mark, self.since_mark = max(self.mark, e[2]), 0.0
        if len(e) > 3 and e[3] is not None:
            self.gpu.append(("backward", e[3], e[4]))

    def optimizer(self, events: list[tuple], i: int, e: tuple) -> None:
        inner = _nested(events, i, self.models)
        self.optimizer_s += e[2] - e[1] - sum(n[2] - n[1] for n in inner)
        self.opt_seen = True
        self.mark = max(self.mark, e[2])
        if len(e) > 3 and e[3] is not None:
            self.gpu += _outside(e[3], e[4], inner)

    def _eval_forward(self, e: tuple) -> None:
        """An evaluation forward: it and the fetches pending before it are evaluation."""
        for p in self.pending:
            if len(p) < 6 or not p[5]:  # an epoch's end names no evaluation iterator
                self.eval_iters.add(p[4])
            self._to_eval(p[1], p[2], p[2] - p[1], 0, None)
        self._to_eval(e[1], e[2], 0.0, 1, e[3])
        self.pending.clear()
        self.mark, self.since_mark = max(self.mark, e[2]), 0.0

    def _to_eval(self, t0: float, t1: float, wait: float, batches: int, n: float | None) -> None:
        ev = self.eval
        if ev is None:
            ev = self.eval = [t0, t1, 0, 0.0, 0.0]
        ev[0], ev[1] = min(ev[0], t0), max(ev[1], t1)
        ev[2] += batches
        ev[3] += n or 0.0
        ev[4] += wait

    def _fetches_trained(self, since: bool) -> None:
        """The pending fetches fed training: their wait, CPU and samples are the step's; with
        `since`, their time after the last hook is not a gap."""
        train_iters, mark = self.train_iters, self.mark
        for p in self.pending:
            self.fetch_wait += p[2] - p[1]
            cpu, ready = _thread_times(p[6] if len(p) > 6 else NAN)
            self.fetch_cpu += cpu
            self.fetch_ready += ready
            self.fetch_n += p[3] or 0.0
            self.fetched = True
            self.fetch_known = self.fetch_known or p[3] is not None
            if train_iters is not None:
                train_iters.add(p[4])
            if since and p[1] >= mark:
                self.since_mark += p[2] - p[1]
        self.pending.clear()

    def parts(self, events: list[tuple], forwards: list[int]) -> StepParts:
        self._fetches_trained(since=False)
        trained = self.forwards
        ev = self.eval
        return StepParts(
            self._start_after_eval(events, forwards),
            self._data_wait(),
            self.fetch_cpu if self.fetched else NAN,
            self.fetch_ready if self.fetched else NAN,
            self._samples(),
            self.forward_s if trained else NAN,
            self.backward_s if trained else NAN,
            self.optimizer_s if self.opt_seen else NAN,
            (ev[0], ev[1], ev[2], ev[3], ev[4]) if ev is not None else None,
            self.gpu,
        )

    def _start_after_eval(self, events: list[tuple], forwards: list[int]) -> float:
        """The step's start: after an evaluation that ended before its first training forward."""
        start, ev = self.start, self.eval
        if ev is None or not math.isfinite(start):
            return start
        first_train = next(
            (
                events[i][1]
                for i in forwards
                if events[i][5] and (events[i][6] or i in self.trained)
            ),
            math.inf,
        )
        return max(start, ev[1]) if ev[1] <= first_train else start

    def _data_wait(self) -> float:
        """The DataLoader's blocked time where batches came from one; else (any other iterator)
        the host time before each training forward and between it and its backward that no hook
        took; NaN (unknown) where neither was seen."""
        if self.fetched:
            return self.fetch_wait
        if self.forwards and math.isfinite(self.start):
            return self.gap
        return NAN

    def _samples(self) -> float:
        """From the model's input (a loader reading ahead cannot shift them), else the batches'."""
        if self.forwards and self.fwd_known:
            return self.fwd_samples
        return self.fetch_n if self.fetch_known else NAN


def _nested(events: list[tuple], i: int, models: frozenset[int] | None) -> list[tuple]:
    """The events that ran inside optimizer step `events[i]` (a closure's forward, backward or
    fetch: `opt.step(closure)`, as Lightning's automatic optimization and LBFGS call it), in order.
    They are their own phases, not the optimizer's. Events are listed as they end, so those inside
    are the ones just before it that began after it."""
    t0 = events[i][1]
    inner = []
    for k in range(i - 1, -1, -1):
        e = events[k]
        if e[2] < t0:
            break
        if e[1] >= t0 and (e[0] in "fB" or (e[0] == "F" and models is not None and e[4] in models)):
            inner.append(e)
    inner.reverse()
    return inner


def _outside(begin: Any, end: Any, inner: list[tuple]) -> list[tuple[str, Any, Any]]:
    """GPU spans of an optimizer step from its marks `begin`..`end`, leaving out the events inside
    it (`_nested`); none where one of those has no GPU marks (its time could not be taken out)."""
    spans, at = [], begin
    for e in inner:
        marks = (e[7], e[8]) if e[0] == "F" and len(e) > 8 else e[3:5] if e[0] == "B" else ()
        if e[0] == "f":
            continue  # a fetch takes no GPU time of its own
        if len(marks) < 2 or marks[0] is None or marks[1] is None:
            return []
        spans.append(("optimizer", at, marks[0]))
        at = marks[1]
    spans.append(("optimizer", at, end))
    return spans


def _thread_times(cpu: Any) -> tuple[float, float]:
    """(seconds on a CPU, seconds ready for one) of a fetch event's CPU field."""
    if isinstance(cpu, tuple):
        return between(*cpu)
    return float(cpu), NAN


def gpu_marks(events: list[tuple]) -> list[Any]:
    """Every GPU mark a step's events hold (see `split_step`), evaluation forwards' included."""
    marks = []
    for e in events:
        kind = e[0]
        if kind == "F":
            if len(e) > 7:
                marks += e[7:9]
        elif kind != "f" and len(e) > 3:
            marks += e[3:5]
    return [m for m in marks if m is not None]
