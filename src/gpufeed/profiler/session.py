"""Run directory and identity: where a run is written, what its files are called, who is writing.

Layout of a run directory::

    meta.json                 what ran, when, on what (written by `gpufeed profile` or `gpufeed.profile()`;
                              "partial_recording": what training processes could not record)
    system-<host>.db          one system sampler per host
    steps-<host>-<pid>.db     one step recorder per training process
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from gpufeed.atomic import write_atomic
from gpufeed.cores import usable_cores
from gpufeed.errors import GpufeedError
from gpufeed.profiler.redact import shell_words

ENV_RUN_DIR = "GPUFEED_RUN_DIR"
DEFAULT_OUT = "gpufeed-runs"
DEFAULT_INTERVAL = 0.2
MIN_INTERVAL, MAX_INTERVAL = 0.05, 60.0
FLUSH_INTERVAL = 0.5
META_FILE = "meta.json"


class ProfileError(GpufeedError, ValueError):
    """Bad input to the profiler, with a message that says what to do; `exit_code` for the CLI."""


def check_interval(interval: float) -> float:
    """The sampling interval as a float, or a ProfileError if outside 0.05-60 s."""
    try:
        value = float(interval)
    except (TypeError, ValueError):
        raise ProfileError(f"--interval must be a number of seconds, got {interval!r}") from None
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise ProfileError(
            f"--interval {interval} is out of range: use {MIN_INTERVAL} to {MAX_INTERVAL:g} seconds"
        )
    return value


ENV_HEADSPACE = "GPUFEED_HEADSPACE"
# Training steps before `--headspace` replays a batch: past the analysis's warm-up (5 steps).
HEADSPACE_AFTER = 10
MAX_HEADSPACE = 100_000


def check_headspace(steps: Any) -> int:
    """`--headspace` as a whole number of steps (0: off), or a ProfileError saying what to give."""
    if isinstance(steps, bool) or not isinstance(steps, (int, str)):
        raise ProfileError(f"--headspace must be a whole number of steps, got {steps!r}")
    try:
        value = int(steps)
    except ValueError:
        raise ProfileError(f"--headspace must be a whole number of steps, got {steps!r}") from None
    if not 0 <= value <= MAX_HEADSPACE:
        raise ProfileError(
            f"--headspace {steps} is out of range: use 0 (off) to {MAX_HEADSPACE:,} steps; "
            "20 to 50 measure the ceiling well"
        )
    return value


def process_start_time() -> float:
    """When this process started, in epoch seconds (psutil; the current time if unavailable)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


ENV_HOST = "GPUFEED_HOST"


def hostname() -> str:
    """This host's name as used in run files and frames: $GPUFEED_HOST where set (a node name where
    containers get random hostnames), else the OS's."""
    return os.environ.get(ENV_HOST) or socket.gethostname() or "localhost"


FILE_SAFE_MAX = 100  # characters: a run directory adds 23, and file names stop at 255 bytes


def file_safe(text: str) -> str:
    """`text` reduced to letters, digits, '.', '_' and '-' so that it can name a file; a long
    one keeps its start and a hash of the whole, so that two long names stay apart."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run"
    if len(safe) <= FILE_SAFE_MAX:
        return safe
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=4).hexdigest()
    return f"{safe[: FILE_SAFE_MAX - 9]}-{digest}"


def identity() -> dict[str, Any]:
    """Host, rank, local rank and world size of this process (torchrun's env, else torch.distributed)."""
    env = os.environ
    rank, local_rank, world = env.get("RANK"), env.get("LOCAL_RANK"), env.get("WORLD_SIZE")
    if rank is None:
        # mp.spawn-style DDP sets no env; ask torch.distributed if the script already initialized it.
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        except Exception:
            pass
    rank_no = _env_int("RANK", rank, 0)
    return {
        "host": hostname(),
        "rank": rank_no,
        "local_rank": _env_int("LOCAL_RANK", local_rank, rank_no),
        "world_size": _env_int("WORLD_SIZE", world, 1),
        "pid": os.getpid(),
    }


def _env_int(name: str, value: Any, fallback: int) -> int:
    """`value` of the environment variable `name` as a number; unset or empty: `fallback`; not a
    number: `fallback`, said once (`LOCAL_RANK=$SLURM_LOCALID` outside srun exports an empty one:
    recording must not stop over it)."""
    if isinstance(value, int):
        return value
    text = str(value or "").strip()
    if not text:
        return fallback
    try:
        return int(text)
    except ValueError:
        warn_once(f"env-{name}", f"${name}={text!r} is not a number: recorded as {fallback}")
        return fallback


_LAUNCHER_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


def run_name(command: list[str]) -> str:
    """A default run name from a command: the script's stem (also inside a `sh -c` string), the
    `-m` module (past a launcher such as `torch.distributed.run`), or the program. Never more of a
    shell string than a script's stem: it may set a secret (`HF_TOKEN=... python train.py`)."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command) and command[i + 1] not in _LAUNCHER_MODULES:
            return file_safe(command[i + 1].rsplit(".", 1)[-1])
        # a shell string (after -c, -lc, -ec, ...): an argument with spaces that names no file
        spaced = any(c.isspace() for c in arg) and not os.path.isfile(arg)
        shell = (i > 0 and command[i - 1] == "-c") or spaced
        words = shell_words(arg) if shell else [arg]
        script = next((w for w in words if w.endswith(".py") and "=" not in w), None)
        if script is not None:
            return file_safe(Path(script).stem)
    return file_safe(Path(command[0]).name) if command else "run"


def create_run_dir(out: str | os.PathLike[str] | None, name: str) -> Path:
    """Create `<out>/<name>-<YYYYmmdd-HHMMSS>-<id>`; ProfileError if `out` cannot hold it."""
    base = Path(out if out is not None else DEFAULT_OUT)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = base / f"{file_safe(name)}-{stamp}-{os.urandom(3).hex()}"
    try:
        base.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir()
        probe = run_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ProfileError(
            f"cannot write the run directory under --out {str(base)!r}: {e.strerror or e}; "
            "choose a writable directory with --out DIR"
        ) from None
    return run_dir


def steps_store_path(run_dir: str | os.PathLike[str], host: str, pid: int) -> Path:
    """Store file of one training process."""
    return Path(run_dir) / f"steps-{file_safe(host)}-{pid}.db"


def system_store_path(run_dir: str | os.PathLike[str], host: str) -> Path:
    """Store file of the system sampler of one host."""
    return Path(run_dir) / f"system-{file_safe(host)}.db"


def main_pids(run_dir: str | os.PathLike[str], host: str) -> set[int]:
    """Pids of this host's training processes, from the names of their store files."""
    prefix = f"steps-{file_safe(host)}-"
    pids = set()
    try:
        names = os.listdir(run_dir)
    except OSError:
        return pids
    for n in names:
        if n.startswith(prefix) and n.endswith(".db"):
            tail = n[len(prefix) : -3]
            if tail.isdigit():
                pids.add(int(tail))
    return pids


def machine_meta() -> dict[str, Any]:
    """Host, CPU and library facts for meta.json (no torch import: versions come from metadata)."""
    import platform
    from importlib import metadata

    versions: dict[str, str] = {"python": platform.python_version()}
    for dist in ("gpufeed", "torch", "numpy", "pandas", "psutil", "nvidia-ml-py"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "hosts": [hostname()],
        "cpu_count": usable_cores(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "versions": versions,
    }


def cpu_model() -> str:
    """The CPU model name (Linux /proc/cpuinfo, else platform)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def write_meta(run_dir: str | os.PathLike[str], meta: dict[str, Any]) -> None:
    """Write meta.json atomically (temp file + rename), so a reader never sees half a file.

    Raises OSError if it cannot be written; the temp file is never left behind.
    """
    write_atomic(Path(run_dir) / META_FILE, json.dumps(meta, indent=2, default=str))


def read_meta(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """meta.json of a run directory ({} if absent)."""
    path = Path(run_dir) / META_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text())


@contextlib.contextmanager
def meta_lock(run_dir: str | os.PathLike[str], wait: float = 5.0) -> Iterator[None]:
    """Hold the run directory's lock while meta.json is read, changed and written: the launcher and
    training processes (`note_partial`) merge into it, and a merge must not undo another's. An
    flock on the directory itself (no lock file). Where it cannot be taken within `wait` seconds
    (its holder stopped, a file system without locks) the merge goes on without it."""
    try:
        import fcntl  # not on Windows, where runs are only read
    except ImportError:
        yield
        return
    try:
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            except OSError:
                break
        yield
    finally:
        os.close(fd)  # releases the lock


def update_meta(run_dir: str | os.PathLike[str], **items: Any) -> None:
    """Merge `items` into meta.json."""
    with meta_lock(run_dir):
        meta = read_meta(run_dir)
        meta.update(items)
        write_meta(run_dir, meta)


def save_meta(run_dir: str | os.PathLike[str], **items: Any) -> bool:
    """Merge `items` into meta.json, best effort: a failure warns once per run directory and never
    raises (the profiled command must not notice). True if written."""
    try:
        with meta_lock(run_dir):
            try:
                meta = read_meta(run_dir)
            except Exception:  # damaged: what we know replaces it
                meta = {}
            meta.update(items)
            write_meta(run_dir, meta)
        return True
    except Exception as e:
        warn_once(
            str(run_dir),
            f"cannot write {Path(run_dir) / META_FILE}: {e}; the command continues, "
            "the run directory will be incomplete",
        )
        return False


PARTIAL_KEY = "partial_recording"


def note_partial(run_dir: str | os.PathLike[str], entries: list[dict[str, Any]]) -> bool:
    """Put `entries` (what a process could not record, and why) in meta.json's "partial_recording"
    list, each replacing an earlier one of the same host, pid and reason. Best effort: False where
    meta.json is missing or cannot be written (the process's store holds the entries too)."""

    def key(note: dict[str, Any]) -> tuple:
        return note.get("host"), note.get("pid"), note.get("reason")

    new = {key(e) for e in entries}
    try:
        with meta_lock(run_dir):
            meta = read_meta(run_dir)
            if not meta:
                return False
            notes = [n for n in meta.get(PARTIAL_KEY) or [] if isinstance(n, dict)]
            meta[PARTIAL_KEY] = [n for n in notes if key(n) not in new] + list(entries)
            write_meta(run_dir, meta)
        return True
    except Exception:
        return False


# A forked child that trains is a second trainer beside its parent (`PartialRecording`).
_trainer: tuple[Any, Any] | None = None  # this process's (pid, rank) once it records steps
_fork_parent: tuple[Any, Any] | None = None  # in a fork of a trainer: the parent's (pid, rank)
_forked = False  # this process is a fork (no exec) of a profiled process


def _after_fork() -> None:
    global _trainer, _fork_parent, _forked
    _fork_parent, _trainer, _forked = _trainer, None, True


os.register_at_fork(after_in_child=_after_fork)


def forked_child() -> bool:
    """Whether this process is a fork (no exec) of a profiled process."""
    return _forked


def close_before_os_exit(close: Callable[[], Any], seconds: float = 5.0) -> None:
    """Make os._exit call `close` first, for at most `seconds` (in a thread: a hung flush must not
    hang the exit). A forked child ends with os._exit, past atexit, and would lose its last
    flush: every step, where it trains for less than one."""
    real = os._exit
    if getattr(real, "gpufeed_close", None) is not None:
        return

    def _exit(code: int) -> NoReturn:
        flusher = threading.Thread(target=close, name="gpufeed-exit-flush", daemon=True)
        with contextlib.suppress(Exception):
            flusher.start()
            flusher.join(seconds)
        real(code)

    _exit.gpufeed_close = close  # type: ignore[attr-defined]
    os._exit = _exit


class PartialRecording:
    """What one training process cannot record as it should, and why, for meta.json and its store.

    `thread_stepped`: an optimizer stepped in a thread other than the recorded loop's (several
    training threads: one loop per process is recorded). `forked` (found when made): the process
    is a fork of a training process and trains as the same rank. Each warns once; `take()` gives
    the entries to write when they changed (and always at the end: the counts)."""

    def __init__(self, who: dict[str, Any], store: Path) -> None:
        global _trainer
        self._who = {k: who.get(k) for k in ("host", "pid", "rank")}
        self._store = store
        self._threads: dict[threading.Thread, int] = {}  # thread -> optimizer steps unrecorded
        self._parent: int | None = None
        self._changed = False
        _trainer = (self._who["pid"], self._who["rank"])
        if _fork_parent is not None and _fork_parent[1] == self._who["rank"]:
            self.forked(_fork_parent[0])

    def thread_stepped(self, thread: threading.Thread) -> None:
        """Count one optimizer step of `thread`, whose steps are not recorded (called by it: a
        dict update, and a warning the first time)."""
        steps = self._threads.get(thread)
        self._threads[thread] = 1 if steps is None else steps + 1
        if steps is None:
            self._changed = True
            warn_once("partial-threads", self._threads_note()["message"])

    def forked(self, parent: int) -> None:
        """This process was forked from training process `parent` and trains as its rank."""
        self._parent = parent
        self._changed = True
        warn_once("partial-forked", self._forked_note()["message"])

    def notes(self) -> list[dict[str, Any]]:
        """One entry per reason: host, pid, rank, reason, its details and a message."""
        notes = [self._threads_note()] if self._threads else []
        return notes + ([self._forked_note()] if self._parent is not None else [])

    def take(self, final: bool = False) -> list[dict[str, Any]]:
        """The entries where they changed since the last call (all of them if `final`), else []."""
        if not (self._changed or final):
            return []
        self._changed = False
        return self.notes()

    def publish(self, notes: list[dict[str, Any]]) -> None:
        """Write `notes` (from `take`) into the run's meta.json, best effort."""
        if notes:
            note_partial(self._store.parent, notes)

    def _threads_note(self) -> dict[str, Any]:
        others: dict[str, int] = {}  # by name (two threads of one name count together)
        for thread, steps in list(self._threads.items()):
            others[thread.name] = others.get(thread.name, 0) + steps
        message = (
            f"several threads train in process {self._who['pid']}: one training loop per "
            f"process is recorded, so the optimizer steps of thread(s) "
            f"{', '.join(map(repr, others))} are not recorded as steps and their work falls in "
            "the recorded ones; run one training loop per process (e.g. torchrun "
            "--nproc_per_node N) to record each"
        )
        return {**self._who, "reason": "threads", "threads": others, "message": message}

    def _forked_note(self) -> dict[str, Any]:
        message = (
            f"process {self._who['pid']}, forked from training process {self._parent}, trains "
            f"too, as the same rank {self._who['rank']}: its steps are recorded apart, in "
            f"{self._store.name}, and read as that rank's beside its parent's; give each trainer a "
            "rank of its own (torch.distributed) or start it as a process of its own (torchrun)"
        )
        return {**self._who, "reason": "forked", "forked_from": self._parent, "message": message}


_warned: set[str] = set()
os.register_at_fork(after_in_child=_warned.clear)  # a forked child is a process of its own


def warn_once(key: str, message: str) -> bool:
    """Print `gpufeed: warning: MESSAGE` to stderr unless this process already warned about `key`.

    Writers of one run directory share its path as key, so a storage fault is one line per process,
    not one per writer tick. Never raises (stderr may be closed); True if this call warned.
    """
    if key in _warned:
        return False
    _warned.add(key)
    try:
        sys.stderr.write(f"gpufeed: warning: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass
    return True


def warned(key: str) -> bool:
    """Whether this process has warned about `key`."""
    return key in _warned
