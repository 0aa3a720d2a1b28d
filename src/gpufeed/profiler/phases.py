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
    meanwhile: two `threadclock` readings or seconds]]) a batch fetched; ("F", t0, t1, samples, module id,
    grad enabled, module.training[, gpu begin, gpu end]) a forward of a root module; ("B", t0, t1[,
    gpu begin, gpu end]) a backward pass; ("O", t0, t1[, gpu begin, gpu end]) an optimizer step.
    GPU marks (None where not taken) of training forwards, backward passes and optimizer steps
    go to `gpu`. A forward is evaluation when it runs without grad, or in eval()
    mode with no backward after it; the batches fetched before it, and every later batch of the same
    iterator, are evaluation too. The step then starts where the evaluation ended. Data wait is the
    DataLoader's blocked time where batches came from one; else (any other iterator) the host time
    before each training forward and between it and its backward that no hook attributes elsewhere;
    NaN (unknown) where neither was seen. Its CPU is the training thread's time on a CPU across
    those fetches, and its ready time its time runnable but off a core; NaN where any of them was
    not measured (ready: not measurable here) or the wait was not a DataLoader's. Samples come
    from the model's input (a loader reading ahead cannot shift them), else from
    the fetched batches. `eval_iters` (ids of evaluation iterators) is updated in place, and so is
    `train_iters` (those that fed training steps) when given.
    """
    forwards = [
        i for i, e in enumerate(events) if e[0] == "F" and models is not None and e[4] in models
    ]
    backward_after = set()
    for j, i in enumerate(forwards):
        nxt = forwards[j + 1] if j + 1 < len(forwards) else len(events)
        if any(events[k][0] == "B" for k in range(i + 1, nxt)):
            backward_after.add(i)
    ev: list[Any] | None = None  # [t0, t1, batches, samples, wait]
    pending: list[tuple] = []
    fetch_wait, fetch_n, fetched, fetch_known = 0.0, 0.0, False, False
    fetch_cpu = fetch_ready = 0.0
    fwd = bwd = opt = 0.0
    n_fwd, opt_seen, fwd_samples, fwd_known, primary = 0, False, 0.0, True, None
    gap, mark, since_mark = 0.0, start, 0.0
    gpu: list[tuple[str, Any, Any]] = []

    def to_eval(t0: float, t1: float, wait: float, batches: int, n: float | None) -> None:
        nonlocal ev
        if ev is None:
            ev = [t0, t1, 0, 0.0, 0.0]
        ev[0], ev[1] = min(ev[0], t0), max(ev[1], t1)
        ev[2] += batches
        ev[3] += n or 0.0
        ev[4] += wait

    def to_training(fetch: tuple) -> None:
        nonlocal fetch_wait, fetch_cpu, fetch_ready, fetch_n, fetched, fetch_known
        fetch_wait += fetch[2] - fetch[1]
        cpu, ready = _thread_times(fetch[6] if len(fetch) > 6 else NAN)
        fetch_cpu, fetch_ready = fetch_cpu + cpu, fetch_ready + ready
        fetch_n += fetch[3] or 0.0
        fetched, fetch_known = True, fetch_known or fetch[3] is not None
        if train_iters is not None:
            train_iters.add(fetch[4])

    for i, e in enumerate(events):
        kind = e[0]
        if kind == "f":
            if e[4] in eval_iters:
                to_eval(e[1], e[2], e[2] - e[1], 0, None)
                mark = max(mark, e[2])
            else:
                pending.append(e)
        elif kind == "F":
            if models is None or e[4] not in models:
                continue
            if not e[5] or (not e[6] and i not in backward_after):
                for p in pending:
                    if len(p) < 6 or not p[5]:  # an epoch's end names no evaluation iterator
                        eval_iters.add(p[4])
                    to_eval(p[1], p[2], p[2] - p[1], 0, None)
                to_eval(e[1], e[2], 0.0, 1, e[3])
                pending.clear()
                mark, since_mark = max(mark, e[2]), 0.0
                continue
            for p in pending:
                to_training(p)
                if p[1] >= mark:
                    since_mark += p[2] - p[1]
            pending.clear()
            gap += max(0.0, e[1] - mark - since_mark)
            fwd += e[2] - e[1]
            n_fwd += 1
            if len(e) > 7 and e[7] is not None:
                gpu.append(("forward", e[7], e[8]))
            primary = e[4] if primary is None else primary
            if e[4] == primary:
                if e[3] is None:
                    fwd_known = False
                else:
                    fwd_samples += e[3]
            mark, since_mark = max(mark, e[2]), 0.0
        elif kind == "B":
            if n_fwd:  # between forward and backward: nanoGPT fetches its next batch here
                gap += max(0.0, e[1] - mark - since_mark)
            bwd += e[2] - e[1]
            mark, since_mark = max(mark, e[2]), 0.0
            if len(e) > 3 and e[3] is not None:
                gpu.append(("backward", e[3], e[4]))
        elif kind == "O":
            inner = _nested(events, i, models)
            opt += e[2] - e[1] - sum(n[2] - n[1] for n in inner)
            opt_seen = True
            mark = max(mark, e[2])
            if len(e) > 3 and e[3] is not None:
                gpu += _outside(e[3], e[4], inner)
    for p in pending:
        to_training(p)
    first_train = next(
        (events[i][1] for i in forwards if events[i][5] and (events[i][6] or i in backward_after)),
        math.inf,
    )
    if ev is not None and ev[1] <= first_train:
        start = max(start, ev[1]) if math.isfinite(start) else start
    wait_cpu, wait_ready = (fetch_cpu, fetch_ready) if fetched else (NAN, NAN)
    if fetched:
        wait = fetch_wait
    elif n_fwd and math.isfinite(start):
        wait = gap
    else:
        wait = NAN
    if n_fwd and fwd_known:
        samples = fwd_samples
    elif fetch_known:
        samples = fetch_n
    else:
        samples = NAN
    return StepParts(
        start,
        wait,
        wait_cpu,
        wait_ready,
        samples,
        fwd if n_fwd else NAN,
        bwd if n_fwd else NAN,
        opt if opt_seen else NAN,
        (ev[0], ev[1], ev[2], ev[3], ev[4]) if ev is not None else None,
        gpu,
    )


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
