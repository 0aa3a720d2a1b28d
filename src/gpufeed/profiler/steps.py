"""Step recorder: per-step timing kept in a bounded in-memory queue, written by a background thread.

The training thread only reads a clock and appends a tuple per event (about a microsecond): batches
fetched, forwards of the model being optimized, backward passes, optimizer steps. A flush thread
turns each step's events into its phases (`split_step`: data wait, forward, backward, optimizer,
evaluation passes taken out), writes them to this process's store every FLUSH_INTERVAL seconds, and
reads the step's CUDA events (its span and, where the model lives on a GPU, its phases on the GPU
clock: `clocks`) once `Event.query()` says they are done, so the host is never synchronized. If the store
cannot be written, events are dropped and counted, one warning is printed, and training goes on.
The recorder also notes what precision the steps computed in (autocast per step, the optimizer's
parameter dtype once).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from gpufeed.profiler.batches import batch_kind, batch_size
from gpufeed.profiler.clocks import CudaClock, Spans
from gpufeed.profiler.headspace import NOTHING, Headspace
from gpufeed.profiler.phases import gpu_marks, split_step
from gpufeed.profiler.precision import autocast_active, dtype_name, param_precision
from gpufeed.profiler.session import FLUSH_INTERVAL, PARTIAL_KEY, PartialRecording, warn_once
from gpufeed.profiler.store import Store

NAN = math.nan
# The phases timed on the GPU clock, as `Spans` names them (and the store's gpu_phases columns).
GPU_PHASES = ("forward", "backward", "optimizer")


class Recorder:
    """Records the steps of one training process into its own store file.

    `autocast` is set by the autocast hook to (device_type, dtype) when an enabled autocast region
    is entered; the step in progress then counts as computed in that dtype. `gpu_phases` is set by
    the hooks when the model being optimized lives on a CUDA device: they then take `gpu_mark()`s
    around forward, backward and optimizer step, and the steps get GPU-clock phases.
    """

    def __init__(
        self,
        path: str | Path,
        info: dict[str, Any],
        capacity: int = 65536,
        flush_interval: float = FLUSH_INTERVAL,
    ) -> None:
        self.path = Path(path)
        self.dropped = 0
        self._info = dict(info)
        self._capacity = capacity
        self._queue: deque[tuple] = deque()
        self._workers: deque[tuple[int, float]] = deque()
        self._offset = time.time() - time.perf_counter()  # perf_counter -> epoch seconds
        self._step = 0
        self._start: float | None = None  # start of the step in progress (perf_counter)
        self._events: list[tuple] = []  # what happened in the step in progress (see split_step)
        self._eval_iters: set[int] = set()  # ids of iterators that fed evaluation passes
        self._train_iters: set[int] = set()  # ... and training steps
        self._iter_workers: dict[int, int] = {}  # iterator id -> its loader worker processes
        self._saved_workers = -1  # a training DataLoader with num_workers=0 is recorded as 0
        self.batch_kind: str | None = None  # "image" or "other": what the DataLoader delivered
        self._saved_kind: str | None = None
        # ids of the root modules whose parameters the optimizer trains; None until its first step
        self.models: frozenset[int] | None = None
        self._explicit = False
        self._hook_ended = False  # the last step was ended by the optimizer hook
        self._primary: weakref.ref | None = None
        self._primary_thread: threading.Thread | None = None  # whose optimizer steps end steps
        self.partial = PartialRecording(self._info, self.path)  # what is not recorded
        self._last_iter = 0
        self._cuda = None  # torch.cuda once it is initialized
        self._gpu_off = False  # CUDA events failed once: GPU time is not measured any more
        self._clock: CudaClock | None = None  # made at the first GPU mark
        self._spans: Spans | None = None  # steps whose GPU marks wait to be read (flush thread)
        self._saved_span_drops = 0
        self.gpu_phases = False
        self.headspace: Headspace | None = None  # `--headspace`: steps fed a kept batch
        self._saved_window: tuple[int, int] | None = None
        self._ev_start: Any = None
        self._ev_prev_end: Any = None
        self.autocast: tuple[str, Any] | None = None
        self._autocast_steps: dict[Any, int] = {}  # autocast dtype -> steps that ran under it
        self._params: str | None = None  # precision of the optimizer's parameters, "" if none
        self._saved_precision: str | None = None
        self._saved_cuda: bool | None = None  # whether this process initialized CUDA, as saved
        self._store: Store | None = None
        self._warned = False
        self._saved_dropped = 0
        self._flush_lock = threading.Lock()
        self._closing = False
        self._stop = threading.Event()
        self._flush_interval = flush_interval
        self._thread = threading.Thread(target=self._run, name="gpufeed-flush", daemon=True)
        self._thread.start()

    # --- hot path (training thread) ------------------------------------------------------------

    def begin(self) -> None:
        """Mark now as the start of the first step (the in-code API calls this on entry)."""
        if self._start is None:
            self._start = time.perf_counter()

    def on_batch(
        self, t0: float, t1: float, batch: Any, iterator: Any = None, cpu: Any = NAN
    ) -> None:
        """A DataLoader `__next__` blocked from t0 to t1 (perf_counter) and returned `batch`.
        `cpu`: the calling thread's CPU meanwhile, as two `threadclock.reading()`s (start, end) or
        seconds (NaN: not measured)."""
        if self._start is None:
            self._start = t0
        self._events.append(("f", t0, t1, batch_size(batch), iterator_serial(iterator), False, cpu))
        if iterator is not None and id(iterator) != self._last_iter:
            self._last_iter = id(iterator)
            if self.batch_kind is None:
                self.batch_kind = batch_kind(batch)
            workers = getattr(iterator, "_workers", None)
            if workers is not None and len(self._iter_workers) < 4096:
                self._iter_workers[iterator_serial(iterator)] = len(workers)
            now = time.time()
            for w in getattr(iterator, "_workers", ()):
                self._workers.append((w.pid, now))
        if self._ev_start is None and self.cuda_ready():
            self._ev_start = self.gpu_mark()
        if self.headspace is not None:
            self.headspace.offer(self._step, iterator_serial(iterator), batch)

    def replay(self, iterator: Any) -> Any:
        """`--headspace`: the kept batch, recorded as fetched at once, where the step in progress
        is replayed and `iterator` fed training; else `headspace.NOTHING` (ask the loader)."""
        batch = self.headspace.replay(self._step, iterator_serial(iterator))  # type: ignore[union-attr]
        if batch is not NOTHING:
            t = time.perf_counter()
            self.on_batch(t, t, batch, iterator, 0.0)
        return batch

    def on_wait(self, t0: float, t1: float, iterator: Any = None, cpu: Any = NAN) -> None:
        """A DataLoader `__next__` blocked from t0 to t1 and ended the epoch (StopIteration)."""
        if self._start is None:
            self._start = t0
        self._events.append(("f", t0, t1, None, iterator_serial(iterator), True, cpu))

    def on_iter_start(self, t0: float, t1: float, iterator: Any, cpu: Any = NAN) -> None:
        """`iter(DataLoader)` took t0..t1 (worker start-up): input time of the batches it feeds."""
        if self._start is None:
            self._start = t0
        self._events.append(("f", t0, t1, None, iterator_serial(iterator), False, cpu))

    def on_forward(
        self,
        module_id: int,
        t0: float,
        t1: float,
        n: int | None,
        grad: bool,
        training: bool,
        g0: Any = None,
        g1: Any = None,
    ) -> None:
        """A root module's forward ran from t0 to t1 on a batch of n (grad mode, train mode); g0, g1:
        its GPU marks (`gpu_mark()`), None where not taken."""
        self._events.append(("F", t0, t1, n, module_id, grad, training, g0, g1))
        if self._ev_start is None:
            # the forward's own mark starts the step's GPU span where it has one
            self._ev_start = g0 if g0 is not None or not self.cuda_ready() else self.gpu_mark()

    def on_backward(self, t0: float, t1: float, g0: Any = None, g1: Any = None) -> None:
        """A backward pass ran from t0 to t1 (g0, g1: its GPU marks, or None)."""
        self._events.append(("B", t0, t1, g0, g1))

    def on_optimizer(self, t0: float, t1: float, g0: Any = None, g1: Any = None) -> None:
        """An optimizer's step ran from t0 to t1 (any optimizer; the step itself ends elsewhere)."""
        self._events.append(("O", t0, t1, g0, g1))

    def on_optimizer_step(self, optimizer: Any) -> None:
        """Optimizer post-step hook: ends a step unless explicit steps or another optimizer lead."""
        if self._params is None:
            try:
                self._params = param_precision(optimizer) or ""
            except Exception:  # an optimizer of unusual shape: precision stays unknown
                self._params = ""
        if self._explicit:
            return
        primary = self._primary() if self._primary is not None else None
        thread = threading.current_thread()  # not its ident: a new thread may reuse a dead one's
        if primary is not optimizer:
            if primary is not None:
                # several optimizers (e.g. a GAN): the first one to step marks the steps; one in
                # another thread is another training loop, whose steps go unrecorded
                if thread is not self._primary_thread:
                    self.partial.thread_stepped(thread)
                return
            self._primary = weakref.ref(optimizer)
        self._primary_thread = thread
        self.end_step(None)
        self._hook_ended = True

    def mark_step(self, samples: float | None) -> None:
        """`gpufeed.step()`: from now on explicit calls define the steps of this process. The
        first one, right after the optimizer hook ended the step, ends none of its own: a loop
        that calls `gpufeed.step()` after `optimizer.step()` has as many steps as iterations."""
        first = not self._explicit
        self._explicit = True
        if first and self._hook_ended and all(e[0] == "O" for e in self._events):
            return  # (other optimizers of the same step, e.g. a GAN's, may have stepped since)
        self.end_step(samples)

    def end_step(self, samples: float | None) -> None:
        """End the step in progress now."""
        self._hook_ended = False
        t = time.perf_counter()
        start = self._start if self._start is not None else NAN
        ev0 = ev1 = None
        if self.cuda_ready():
            ev1 = self.gpu_mark()
            ev0 = (self._ev_start or self._ev_prev_end) if ev1 is not None else None
        if len(self._queue) < self._capacity:
            row = (self._step, start, t, self._events, samples, ev0, ev1, self._ev_start)
            self._queue.append(row)
        else:
            self.dropped += 1
        amp = self.autocast
        if amp is not None:
            self._autocast_steps[amp[1]] = self._autocast_steps.get(amp[1], 0) + 1
            if not autocast_active(amp[0]):  # a region around the whole loop counts every step
                self.autocast = None
        if self.headspace is not None:
            self.headspace.step_ended(self._events, self.models)
        self._step += 1
        self._start, self._events = t, []
        self._ev_start, self._ev_prev_end = None, ev1

    def precision(self) -> str | None:
        """What the steps computed in: the autocast dtype if at least half of them ran under autocast,
        else the optimizer's parameter dtype; None while unknown."""
        counts = dict(self._autocast_steps)  # a copy: the training thread may be adding a step
        if counts and 2 * sum(counts.values()) >= self._step:
            return dtype_name(max(counts, key=counts.__getitem__))
        return self._params or None

    def cuda_ready(self) -> bool:
        """Whether this process initialized CUDA (and CUDA events have not failed): GPU marks work."""
        if self._cuda is not None:
            return not self._gpu_off
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                self._cuda = torch.cuda
                return True
        except Exception as e:  # a torch without (working) CUDA: no GPU time, steps go on
            self._cuda = False
            self._cuda_failed(e)
        return False

    def gpu_mark(self) -> Any:
        """A CUDA timing event recorded on the current stream now (from the clock's pool); None at
        the pool's cap, and None from then on if CUDA fails. Only where `cuda_ready()`."""
        try:
            clock = self._clock
            if clock is None:
                clock = self._clock = CudaClock(self._cuda)
            return clock.mark()
        except Exception as e:
            self._cuda_failed(e)
            return None

    def _cuda_failed(self, error: BaseException) -> None:
        self._gpu_off = True
        self.gpu_phases = False
        self._ev_start = self._ev_prev_end = None
        warn_once(
            "cuda-events",
            f"CUDA event timing failed ({type(error).__name__}: {error}); "
            "GPU time is not recorded from now on, training continues",
        )

    # --- flushing (background thread) -----------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._flush_interval):
            self._safe_flush()

    def _safe_flush(self) -> None:
        try:
            self.flush()
        except Exception as e:  # a bug of ours must not end recording, nor reach training
            warn_once(
                "flush",
                f"profiler flush failed ({type(e).__name__}: {e}); recording goes on, "
                "training continues",
            )

    def flush(self) -> None:
        """Write queued steps and resolved GPU times; on a store error drop them, count, warn once."""
        with self._flush_lock:
            rows = _drain(self._queue)
            workers = _drain(self._workers)
            step_rows, phase_rows, cpu_rows, eval_rows = self._split_rows(rows)
            gpu_times, gpu_rows = self._resolve_gpu_times()
            closing_tail = self._closing and bool(self._events)
            notes = self.partial.take(final=self._closing)
            idle = not rows and not workers and not gpu_times and not gpu_rows and not notes
            if idle and not closing_tail and self._store is not None:
                return
            if closing_tail:
                eval_rows += self._tail_evaluation()
            info, saved = self._info_changes()
            if notes:
                info[PARTIAL_KEY] = notes
            try:
                if self._store is None:
                    self._store = Store(self.path)
                    info = {**self._info, **info, "dropped_events": self.dropped}
                self._store.write(
                    info,
                    gpu_times,
                    steps=step_rows,
                    phases=phase_rows,
                    cpu_phases=cpu_rows,
                    gpu_phases=gpu_rows,
                    evals=eval_rows,
                    workers=workers,
                )
                self._saved(*saved)
            except Exception as e:  # any store failure: never let it reach training
                self.dropped += len(rows)
                self._warn(e)
            self.partial.publish(notes)  # and in meta.json, where the run is read first

    def _split_rows(self, rows: list[tuple]) -> tuple[list, list, list, list]:
        """The store's steps, phases, cpu_phases and evals rows of the queued steps `rows`; their
        GPU marks handed to `Spans`, read once done."""
        off = self._offset
        step_rows, phase_rows, cpu_rows, eval_rows = [], [], [], []
        for step, start, end, events, explicit, ev0, ev1, own_start in rows:
            parts = split_step(start, events, self.models, self._eval_iters, self._train_iters)
            samples = parts.samples if explicit is None else explicit
            step_rows.append((step, parts.start + off, end + off, parts.data_wait, samples, NAN))
            phase_rows.append((step, parts.forward, parts.backward, parts.optimizer))
            if math.isfinite(parts.data_wait_cpu):
                cpu_rows.append((step, parts.data_wait_cpu, parts.data_wait_ready))
            if parts.evaluation is not None:
                t0, t1, batches, n, wait = parts.evaluation
                eval_rows.append((t0 + off, t1 + off, batches, n, wait))
            if self._clock is not None:
                if self._spans is None:
                    self._spans = Spans(self._clock)
                owned = [own_start, ev1, *gpu_marks(events)]
                self._spans.add(step, [("step", ev0, ev1), *parts.gpu], owned)
        return step_rows, phase_rows, cpu_rows, eval_rows

    def _tail_evaluation(self) -> list[tuple]:
        """At close: an evaluation after the last training step (a final validation pass)."""
        tail = split_step(NAN, self._events, self.models, self._eval_iters).evaluation
        self._events = []
        if tail is None:
            return []
        t0, t1, batches, n, wait = tail
        return [(t0 + self._offset, t1 + self._offset, batches, n, wait)]

    def _info_changes(self) -> tuple[dict[str, Any], tuple]:
        """The store's info entries that changed since last written, and what `_saved` notes
        once they are."""
        info: dict[str, Any] = {}
        if self.dropped != self._saved_dropped:
            info["dropped_events"] = self.dropped
        precision = self.precision()
        if precision != self._saved_precision:
            info["precision"] = precision
        cuda = bool(self._cuda)
        if cuda != self._saved_cuda:
            info["cuda"] = cuda
        loader_workers = max(
            (self._iter_workers.get(i, 0) for i in self._train_iters - self._eval_iters),
            default=-1,
        )
        if loader_workers > self._saved_workers:
            info["loader_workers"] = loader_workers
        kind = self.batch_kind
        if kind != self._saved_kind:
            info["batch_kind"] = kind
        window = self.headspace.window if self.headspace is not None else None
        if window != self._saved_window:
            info["headspace"] = list(window)  # type: ignore[arg-type]
        return info, (precision, cuda, loader_workers, kind, window)

    def _saved(
        self,
        precision: str | None,
        cuda: bool,
        loader_workers: int,
        kind: str | None,
        window: tuple[int, int] | None,
    ) -> None:
        self._saved_dropped = self.dropped
        self._saved_precision = precision
        self._saved_cuda = cuda
        self._saved_workers = max(self._saved_workers, loader_workers)
        self._saved_kind = kind
        self._saved_window = window

    def _resolve_gpu_times(self) -> tuple[list[tuple[float, int]], list[tuple]]:
        """(gpu_time, step) pairs and gpu_phases rows of the steps whose CUDA events are done.

        Steps dropped for waiting too long (beyond `clocks.MAX_PENDING`) count as dropped events;
        an event that fails to read leaves its figures NaN, it never stops recording."""
        spans = self._spans
        if spans is None:
            return [], []
        times, phases = [], []
        for step, seconds in spans.resolve():
            if "step" in seconds:
                times.append((seconds["step"], step))
            if any(p in seconds for p in GPU_PHASES):
                phases.append((step, *(seconds.get(p, NAN) for p in GPU_PHASES)))
        self.dropped += spans.dropped - self._saved_span_drops
        self._saved_span_drops = spans.dropped
        return times, phases

    def _gpu_pending(self) -> bool:
        return bool(self._queue) or (self._spans is not None and len(self._spans) > 0)

    def _warn(self, error: BaseException) -> None:
        if not self._warned:
            self._warned = True
            # Keyed by the run directory: one line per process, whichever of its writers fails.
            warn_once(
                str(self.path.parent),
                f"cannot write profile store {self.path}: {error}; "
                "dropping profiler events, training continues",
            )

    def close(self, gpu_wait: float = 2.0) -> None:
        """Stop the flush thread, write what is left and this process's end time."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._closing = True
        # Training is over: GPU times still in flight may be waited for, briefly.
        deadline = time.monotonic() + gpu_wait
        while self._gpu_pending() and time.monotonic() < deadline:
            self._safe_flush()
            if self._gpu_pending():
                time.sleep(0.01)
        self._safe_flush()
        with self._flush_lock:
            store, self._store = self._store, None
            if store is not None:
                try:
                    store.write({"end": time.time(), "dropped_events": self.dropped})
                except Exception as e:
                    self._warn(e)
                with contextlib.suppress(Exception):
                    store.close()
        if self.dropped:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"gpufeed: {self.dropped} profiler events were dropped\n")


_serials = itertools.count(1)


def iterator_serial(iterator: Any) -> int:
    """A number naming this iterator for the whole run (ids of dead iterators are reused)."""
    if iterator is None:
        return 0
    try:
        return iterator._gpufeed_serial
    except AttributeError:
        pass
    n = next(_serials)
    try:
        iterator._gpufeed_serial = n
    except Exception:  # no attributes (slots, None): its id has to do
        return id(iterator)
    return n


def _drain(queue: deque) -> list:
    # deque.popleft is atomic, so the training thread may keep appending while we drain.
    out = []
    try:
        while True:
            out.append(queue.popleft())
    except IndexError:
        return out
