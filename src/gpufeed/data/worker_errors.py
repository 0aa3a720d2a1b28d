"""A worker's exception, carried to the training process with what the worker was doing.

An exception raised in a loader worker (a user's `Augment(transform=...)`, a shard that cannot be
read) crosses a pipe, or Ray, to the training process, which raises it at the batch it belongs
to. Pickling drops its traceback, so the worker sends a `WorkerFailure`: the traceback as text,
which worker, which batch and which samples (shard and keys), and the exception itself where it
survives pickling. The training process raises, as torch's DataLoader does, the same type made
from one message that holds all of that (`except ZeroDivisionError:` still catches it); a type
that cannot be made from one message, and gpufeed's own errors (whose one-line message already
names the shard or key and what to do), are raised as the original object with that message as
a note (Python shows notes under the error); one that cannot cross at all is a
LoaderWorkerError. With `num_workers=0` the exception is the original one, its traceback intact,
with the batch and samples added as a note (`note_batch`).
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpufeed.errors import GpufeedError
from gpufeed.text import visible

if TYPE_CHECKING:
    from gpufeed.data.dataset import RawSample
    from gpufeed.data.plan import Position

KEYS_SHOWN = 8  # sample keys a message lists before "and N more"


class LoaderWorkerError(GpufeedError, RuntimeError):
    """A loader worker process died, or failed with an error that could not be sent back."""


def describe_batch(at: Position | None, samples: Sequence[RawSample] | None) -> str:
    """What a worker was making, in words: the batch and its samples' shards and keys (the first
    `KEYS_SHOWN`), or that it was reading the samples of its next batch."""
    if at is None or samples is None:
        return "while reading the samples of its next batch"
    what = f"while making batch {at.batch} of epoch {at.epoch}"
    if not samples:
        return what
    if len(samples) == 1:
        return f"{what} (shard {visible(samples[0].shard)}, key {visible(samples[0].key)})"
    by_shard: dict[str, list[str]] = {}
    for s in samples[:KEYS_SHOWN]:
        by_shard.setdefault(s.shard, []).append(s.key)
    parts = "; ".join(
        f"shard {visible(shard)}: keys {visible(', '.join(keys))}"
        for shard, keys in by_shard.items()
    )
    more = len(samples) - KEYS_SHOWN
    tail = f" and {more} more" if more > 0 else ""
    return f"{what} of {len(samples)} samples ({parts}{tail})"


def note_batch(
    exc: BaseException, at: Position | None, samples: Sequence[RawSample] | None
) -> None:
    """Add to `exc` (raised in the training process itself, `num_workers=0`) a note naming the
    batch and samples it was raised for; its type, message and traceback stay as they are."""
    exc.add_note(f"Raised in the gpufeed loader (num_workers=0) {describe_batch(at, samples)}.")


def _pickled(obj: Any) -> bytes | None:
    """`obj` pickled, if it also unpickles here (an exception whose __init__ takes other
    arguments than its args pickles but does not unpickle); else None."""
    try:
        data = pickle.dumps(obj)
        pickle.loads(data)
        return data
    except Exception:
        return None


def _unpickled(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # a class this process cannot import
        return None


class _KeyErrorMessage(str):
    """A KeyError shows repr() of its message: this one shows itself (as torch's DataLoader)."""

    def __repr__(self) -> str:
        return self


class WorkerFailure(Exception):
    """An exception a worker raised, as the worker sends it (internal): `error()` is what the
    training process raises. An Exception itself so that a Ray actor can raise it."""

    def __init__(
        self,
        type_name: str,
        text: str,
        where: str,
        doing: str,
        exc_type: bytes | None = None,
        original: bytes | None = None,
    ) -> None:
        super().__init__(type_name, text, where, doing, exc_type, original)
        self.type_name, self.text, self.where, self.doing = type_name, text, where, doing
        self.exc_type, self.original = exc_type, original

    @classmethod
    def of(cls, exc: BaseException, where: str, doing: str) -> WorkerFailure:
        """The failure to send for `exc`, raised in `where` (e.g. "loader worker 0 (pid 12)")
        `doing` (`describe_batch`)."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type(exc).__name__, text, where, doing, _pickled(type(exc)), _pickled(exc))

    @property
    def message(self) -> str:
        """torch's wording ("Original Traceback"), which `rate` and other tools look for."""
        return (
            f"Caught {self.type_name} in {self.where} {self.doing}.\n"
            f"Original {visible(self.text.rstrip(), keep_newlines=True)}"
        )

    def error(self) -> BaseException:
        """The exception to raise in the training process: the same type made from the message;
        else the original with the message as a note; else a LoaderWorkerError. A GpufeedError
        (a shard, a corrupt sample) is the original, its message as it was: it names the file or
        key and what to do, in the one line the command line prints; the rest goes in a note."""
        msg = self.message
        cls = _unpickled(self.exc_type)
        original = _unpickled(self.original)
        if isinstance(original, GpufeedError):
            original.add_note(msg)
            return original
        if isinstance(cls, type) and issubclass(cls, BaseException):
            try:
                made = cls(_KeyErrorMessage(msg) if issubclass(cls, KeyError) else msg)
                if msg in str(made):  # not a type that words its message its own way
                    if isinstance(original, BaseException):  # attributes it set besides
                        for name, value in vars(original).items():
                            vars(made).setdefault(name, value)
                    return made
            except Exception:
                pass
        if isinstance(original, BaseException):
            original.add_note(msg)
            return original
        return LoaderWorkerError(msg)
