"""Zero-code PyTorch hooks: optimizer steps end steps, DataLoader `__next__` measures data wait,
the model being optimized's calls and `torch.autograd.backward` time forward and backward and tell
training from evaluation, `autocast.__enter__` notes the precision.

The model is found without the user's help: until the first optimizer step global module hooks note
the outermost modules called; at that step those sharing parameters with the optimizer become the
models and the global hooks (which slow every module call) are removed. A model's calls are then
timed by a `__call__` on its class that lets other instances straight through: torch's module
hooks cost ~10 µs per call, this a few µs. Where the model lives on a CUDA device the same
points also record CUDA events (`Recorder.gpu_mark`), read later: never a host sync.

Hooks are installed when torch's modules are imported (a post-import hook on `sys.meta_path`), so
this module imports no torch itself. A process gets a recorder, and a store file, only at its first
batch or optimizer step: processes that never train (the torchrun launcher, DataLoader workers,
helper scripts) record nothing.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import sys
import threading
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import Any

from gpufeed.profiler.batches import batch_size
from gpufeed.profiler.headspace import NOTHING, headspace_asked
from gpufeed.profiler.post_import import PostImportFinder
from gpufeed.profiler.session import (
    ENV_RUN_DIR,
    close_before_os_exit,
    forked_child,
    identity,
    process_start_time,
    steps_store_path,
    warn_once,
)
from gpufeed.profiler.steps import Recorder
from gpufeed.profiler.threadclock import reading

_DISABLED: Any = False  # sentinel: this process does not record
_recorder: Recorder | Any | None = None  # None: not decided yet
_lock = threading.Lock()
_optimizer_hook: Any = None
_optimizer_pre_hook: Any = None
_global_hooks: list[Any] = []  # global module hooks, removed once the models are known
_model_ids: frozenset[int] = frozenset()  # ids of the models whose calls are timed
_patched_classes: list[tuple[type, Any]] = []  # (model class, its own __call__ or None)
_is_grad_enabled: Callable[[], bool] | None = None
_roots: dict[int, Any] = {}  # id -> weakref of the outermost modules called before the first step
_optimizers: set[int] = set()  # ids of the optimizers whose models are settled
_depth = 0  # nesting of module calls while global hooks are on
_forwards: list[tuple[float, int | None, bool, bool]] = []  # root forwards in progress
_opt_t0 = 0.0
_opt_g0: Any = None
_backward_depth = 0  # nested backward calls (checkpointing, double backward) count once
_MAX_ROOTS = 64
_original_next: Callable[[Any], Any] | None = None
_original_iter: Callable[[Any], Any] | None = None
_original_enter: Callable[[Any], Any] | None = None
_original_backward: Callable[..., Any] | None = None
_pending_autocast: tuple[str, Any] | None = None  # autocast entered before this process trained
_installed = False
hook_errors = 0  # hook calls that failed in this process (their events are dropped)


# --- the recorder of this process ---------------------------------------------------------------


def recorder(create: bool = True) -> Recorder | None:
    """This process's recorder, created on first use when a run directory is set; else None."""
    rec = _recorder
    if rec is None and create:
        rec = _create()
    return rec or None


def _create() -> Recorder | Any:
    global _recorder
    with _lock:
        if _recorder is not None:
            return _recorder
        run_dir = os.environ.get(ENV_RUN_DIR)
        if not run_dir or _in_dataloader_worker():
            _recorder = _DISABLED
            return _recorder
        try:
            who = identity()
            info = {**who, "start": process_start_time()}
            rec = Recorder(steps_store_path(run_dir, who["host"], who["pid"]), info)
        except Exception as e:  # e.g. no thread to flush with: this process records nothing
            _recorder = _DISABLED
            hook_failed(e)
            return _recorder
        rec.autocast = _pending_autocast
        rec.headspace = headspace_asked()
        _recorder = rec
        atexit.register(close)
        # A multiprocessing child ends with os._exit, past atexit; its finalizers still run. A
        # child forked otherwise has none: its os._exit flushes first.
        from multiprocessing import util

        util.Finalize(None, close, exitpriority=10)
        if forked_child():
            close_before_os_exit(close)
        return _recorder


def close() -> None:
    """Flush and close this process's recorder (atexit, or the end of `gpufeed.profile()`)."""
    global _recorder
    with _lock:
        rec, _recorder = _recorder, None
    try:
        if rec and rec.path is not None:
            rec.close()
    except Exception as e:  # at exit too, the profiler never adds a traceback of its own
        hook_failed(e)


def hook_failed(error: BaseException) -> None:
    """A hook (or `gpufeed.step()`) failed: count its event as dropped, warn once, go on."""
    global hook_errors
    hook_errors += 1
    try:
        rec = _recorder
        if rec:
            rec.dropped += 1
    except Exception:  # a recorder that broken is not counting anything any more
        pass
    warn_once(
        "hooks",
        f"profiler hook failed ({type(error).__name__}: {error}); its event is dropped and "
        "counted, training continues",
    )


def reset() -> None:
    """Forget the recorder without flushing (a forked child must not touch its parent's store)."""
    global _recorder, _pending_autocast
    _recorder = _pending_autocast = None


def _in_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


os.register_at_fork(after_in_child=reset)


# --- the hooks ----------------------------------------------------------------------------------


# Every hook runs inside the user's training step: whatever fails in it is counted and dropped
# (`hook_failed`), never raised into the user's code. Only the wrapped call's own outcome (a batch,
# StopIteration, the user's exception) reaches the caller. A try costs nothing until it catches.


def _on_optimizer_pre_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _opt_t0, _opt_g0
    _opt_t0 = perf_counter()
    _opt_g0 = _gpu_begins(_recorder)


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _opt_g0
    try:
        t1 = perf_counter()
        g0, _opt_g0 = _opt_g0, None
        rec = _recorder if _recorder is not None else _create()
        if rec:
            g1 = rec.gpu_mark() if g0 is not None else None
            if id(optimizer) not in _optimizers:
                rec.models = _settle_models(optimizer, rec)
            rec.on_optimizer(_opt_t0 or t1, t1, g0, g1)
            rec.on_optimizer_step(optimizer)
    except Exception as e:
        hook_failed(e)


def _input_size(args: Any, kwargs: Any) -> int | None:
    if args:
        return batch_size(args[0])
    return batch_size(next(iter(kwargs.values()))) if kwargs else None


def _forward_begins(module: Any, args: Any, kwargs: Any = None) -> None:
    torch = sys.modules["torch"]
    n = _input_size(args, kwargs)
    _forwards.append((perf_counter(), n, torch.is_grad_enabled(), bool(module.training)))


def _forward_ends(module: Any, kwargs: Any = None) -> None:
    t1 = perf_counter()
    if not _forwards:
        return
    t0, n, grad, training = _forwards.pop()
    if n is None and kwargs:  # a global pre-hook sees no kwargs: model(x=..., labels=...)
        n = _input_size((), kwargs)
    rec = _recorder
    if rec:
        rec.on_forward(id(module), t0, t1, n, grad, training)


def _gpu_begins(rec: Any) -> Any:
    """A GPU mark where the recorder takes them (a model on a CUDA device), else None."""
    try:
        return rec.gpu_mark() if rec and rec.gpu_phases else None
    except Exception as e:
        hook_failed(e)
        return None


def _timed_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """A model class's `__call__`: times the calls of the models (host clock, and GPU marks where
    the recorder takes them); every other instance of the class goes straight to `original`."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if id(self) not in _model_ids:
            return original(self, *args, **kwargs)
        rec = _recorder
        t0 = perf_counter()
        g0 = _gpu_begins(rec)
        try:
            return original(self, *args, **kwargs)
        finally:
            t1 = perf_counter()
            try:
                if rec:
                    g1 = rec.gpu_mark() if g0 is not None else None
                    n = _input_size(args, kwargs)
                    rec.on_forward(id(self), t0, t1, n, _is_grad_enabled(), self.training, g0, g1)
            except Exception as e:
                hook_failed(e)

    return __call__


def _backward(*args: Any, **kwargs: Any) -> Any:
    """`torch.autograd.backward` (what `Tensor.backward` calls), timed: a backward pass."""
    global _backward_depth
    rec = _recorder
    if not rec or _backward_depth:
        return _original_backward(*args, **kwargs)  # type: ignore[misc]
    _backward_depth += 1
    t0 = perf_counter()
    g0 = _gpu_begins(rec)
    try:
        return _original_backward(*args, **kwargs)  # type: ignore[misc]
    finally:
        t1 = perf_counter()
        _backward_depth -= 1
        try:
            rec.on_backward(t0, t1, g0, rec.gpu_mark() if g0 is not None else None)
        except Exception as e:
            hook_failed(e)


def _global_pre(module: Any, args: Any) -> None:
    global _depth
    _depth += 1
    if _depth == 1:
        try:
            if id(module) not in _roots and len(_roots) < _MAX_ROOTS:
                _roots[id(module)] = weakref.ref(module)
            _forward_begins(module, args)
        except Exception as e:
            _forwards.append((perf_counter(), None, True, True))
            hook_failed(e)


def _global_post(module: Any, args: Any, *rest: Any) -> None:
    """The global forward hook: (module, args, kwargs, output) where torch passes kwargs to
    global hooks, (module, args, output) where it does not."""
    global _depth
    _depth = max(0, _depth - 1)
    if _depth == 0:
        try:
            _forward_ends(module, rest[0] if len(rest) == 2 else None)
        except Exception as e:
            hook_failed(e)


def _settle_models(optimizer: Any, rec: Recorder) -> frozenset[int]:
    """At an optimizer's first step the roots seen before the first step that hold its parameters
    join the models, their calls timed (`_timed_call`); the global module hooks go at the first.
    Each optimizer adds its own: a GAN's generator, first called before the discriminator's
    optimizer steps, is a model once its own optimizer steps. On a CUDA model the recorder takes
    GPU marks from now on. Returns the models' ids (empty: forward and backward stay unmeasured)."""
    global _model_ids, _is_grad_enabled
    _optimizers.add(id(optimizer))
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    models = []
    for key, ref in list(_roots.items()):
        module = ref()
        if module is None:
            del _roots[key]
        elif any(id(p) in params for p in module.parameters()):
            models.append(module)
            del _roots[key]
    _remove_global_hooks()
    _is_grad_enabled = sys.modules["torch"].is_grad_enabled
    _model_ids = _model_ids | frozenset(id(m) for m in models)
    for cls in {type(m) for m in models}:
        if not any(cls is c for c, _ in _patched_classes):
            _patched_classes.append((cls, cls.__dict__.get("__call__")))
            cls.__call__ = _timed_call(cls.__call__)
    on_gpu = any(p.is_cuda for m in models for p in itertools.islice(m.parameters(), 1))
    rec.gpu_phases = rec.gpu_phases or (on_gpu and rec.cuda_ready())
    return _model_ids


def _unpatch_models() -> None:
    global _model_ids
    _model_ids = frozenset()
    for cls, own in _patched_classes:
        if own is None:
            del cls.__call__
        else:
            cls.__call__ = own
    _patched_classes.clear()


def _remove_global_hooks() -> None:
    global _depth
    for handle in _global_hooks:
        handle.remove()
    _global_hooks.clear()
    _depth = 0


def _record(event: str, *args: Any) -> None:
    """Call the recorder's `event` method, creating the recorder first; a failure is counted."""
    try:
        rec = _recorder if _recorder is not None else _create()
        if rec:
            getattr(rec, event)(*args)
    except Exception as e:
        hook_failed(e)


def _next(self: Any) -> Any:
    # This thread's scheduler clock across the wait tells working in it (loading with
    # num_workers=0, unpickling batches) from sleeping on workers or disks: about 1 us a read. Not
    # the process's CPU: idle OpenMP threads spin on cores.
    rec = _recorder
    if rec and (kept := _replayed(rec, self)) is not NOTHING:
        return kept
    t0, c0 = perf_counter(), reading()
    try:
        batch = _original_next(self)  # type: ignore[misc]
    except StopIteration:
        _record("on_wait", t0, perf_counter(), self, (c0, reading()))
        raise
    _record("on_batch", t0, perf_counter(), batch, self, (c0, reading()))
    return batch


def _replayed(rec: Recorder, iterator: Any) -> Any:
    """`--headspace`: the kept batch where this step is replayed (`Recorder.replay`), else NOTHING."""
    try:
        return NOTHING if rec.headspace is None else rec.replay(iterator)
    except Exception as e:
        hook_failed(e)
        return NOTHING


def _iter(self: Any) -> Any:
    # Starting an epoch's iterator (worker processes, pickling the dataset for them) is input time.
    # Its CPU with workers is their start-up (forking), not loading: so the step it falls in has
    # no wait CPU measure (short epochs would otherwise read as "busy receiving batches").
    measured = not getattr(self, "num_workers", 0)
    t0, c0 = perf_counter(), reading() if measured else None
    it = _original_iter(self)  # type: ignore[misc]
    _record("on_iter_start", t0, perf_counter(), it, (c0, reading()) if measured else math.nan)
    return it


def _enter_autocast(self: Any) -> Any:
    global _pending_autocast
    result = _original_enter(self)  # type: ignore[misc]
    try:
        if self._enabled:
            amp = (self.device, self.fast_dtype)
            hash(amp)  # steps are counted per dtype: an unhashable one fails here, not later
            rec = _recorder
            if rec:
                rec.autocast = amp
            elif rec is None:
                _pending_autocast = amp
    except AttributeError:  # a torch whose autocast names these differently: precision unknown
        pass
    except Exception as e:  # e.g. a subclass whose properties raise: precision stays unknown
        hook_failed(e)
    return result


def _patch_optimizer(module: Any) -> None:
    global _optimizer_hook, _optimizer_pre_hook
    if _optimizer_hook is None:
        _optimizer_pre_hook = module.register_optimizer_step_pre_hook(_on_optimizer_pre_step)
        _optimizer_hook = module.register_optimizer_step_post_hook(_on_optimizer_step)


def _patch_modules(module: Any) -> None:
    if not _global_hooks and not _model_ids:
        _global_hooks.append(module.register_module_forward_pre_hook(_global_pre))
        try:  # with the forward's kwargs (HF models take model(input_ids=..., labels=...))
            post = module.register_module_forward_hook(
                _global_post, with_kwargs=True, always_call=True
            )
        except TypeError:  # a torch whose global hooks take no kwargs
            post = module.register_module_forward_hook(_global_post, always_call=True)
        _global_hooks.append(post)


def _patch_dataloader(module: Any) -> None:
    global _original_next, _original_iter
    cls = module._BaseDataLoaderIter
    if _original_next is None:
        _original_next = cls.__next__
        cls.__next__ = _next
    if _original_iter is None:
        _original_iter = module.DataLoader.__iter__
        module.DataLoader.__iter__ = _iter


def _patch_autocast(module: Any) -> None:
    global _original_enter
    cls = module.autocast
    if _original_enter is None:
        _original_enter = cls.__enter__
        cls.__enter__ = _enter_autocast


def _patch_backward(module: Any) -> None:
    global _original_backward
    if _original_backward is None:
        _original_backward = module.backward
        module.backward = _backward


def install() -> None:
    """Install the hooks now for torch modules already imported, else when they are imported."""
    global _installed
    if _installed:
        return
    _installed = True
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
    if any(name not in sys.modules for name in _PATCHES):
        sys.meta_path.insert(0, PostImportFinder(_PATCHES))


def uninstall() -> None:
    """Remove the hooks (end of `gpufeed.profile()` in a process that was not launched under it)."""
    global _optimizer_hook, _optimizer_pre_hook, _original_next, _original_iter, _original_enter
    global _installed, _original_backward
    if _optimizer_hook is not None:
        _optimizer_hook.remove()
        _optimizer_pre_hook.remove()
        _optimizer_hook = _optimizer_pre_hook = None
    _remove_global_hooks()
    _unpatch_models()
    _roots.clear()
    _optimizers.clear()
    if _original_next is not None:
        sys.modules["torch.utils.data.dataloader"]._BaseDataLoaderIter.__next__ = _original_next
        _original_next = None
    if _original_iter is not None:
        sys.modules["torch.utils.data.dataloader"].DataLoader.__iter__ = _original_iter
        _original_iter = None
    if _original_enter is not None:
        sys.modules["torch.amp.autocast_mode"].autocast.__enter__ = _original_enter
        _original_enter = None
    if _original_backward is not None:
        sys.modules["torch.autograd"].backward = _original_backward
        _original_backward = None
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, PostImportFinder)]
    _installed = False


_PATCHES: dict[str, Callable[[Any], None]] = {
    "torch.optim.optimizer": _patch_optimizer,
    "torch.utils.data.dataloader": _patch_dataloader,
    "torch.amp.autocast_mode": _patch_autocast,
    "torch.nn.modules.module": _patch_modules,
    "torch.autograd": _patch_backward,
}
