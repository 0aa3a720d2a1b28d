"""Text for the rules' evidence and advice: shares, durations, worker counts and the advice
sentences several rules give."""

from __future__ import annotations

from gpufeed.text import count


def fmt_pct(share: float) -> str:
    """A share 0-1 as '42%'."""
    return f"{100 * share:.0f}%"


def fmt_ms(seconds: float) -> str:
    """A duration as '42 ms', '2.5 ms' or '80 µs' (never '0 ms' for a short one)."""
    ms = 1e3 * seconds
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms" if ms >= 1 else f"{1e3 * ms:.0f} µs"


def workers_at(n: int, cpu: float, per: str = "") -> str:
    """'1 worker at 62% CPU', '8 workers at 23% CPU each', '2 workers per training process at …'."""
    return f"{count(n, 'worker')}{per} at {cpu:.0f}% CPU{' each' * (n != 1)}"


def one_thread_each(worker_cpu: float, workers: int) -> str:
    """The advice to run each loader worker on one thread where one keeps more than a core busy
    (`worker_cpu` % of a core: threads of OpenCV, OpenMP or BLAS in every worker), with the worker
    count that keeps the cores `workers` such workers use busy; "" otherwise."""
    if not worker_cpu > 100:
        return ""
    each = worker_cpu / 100
    return (
        " Each worker keeps more than a core busy (threads of OpenCV, OpenMP or BLAS inside it): "
        "run one thread per worker (cv2.setNumThreads(1) and torch.set_num_threads(1) in the "
        "DataLoader's worker_init_fn, or OMP_NUM_THREADS=1) to stop them competing for cores; "
        f"with one thread each, about num_workers={max(workers, round(workers * each))} keeps "
        f"the {workers * each:.0f} cores busy that {count(workers, 'worker')} at {each:.1f} "
        "cores each do."
    )


def cut_cost(images: bool, used_gpu: bool) -> str:
    """How to cut the CPU cost per sample, for images or other data (augmentation on the GPU only
    where the run used one)."""
    if images:
        gpu = ", augmentation on the GPU" if used_gpu else ""
        return "pre-resized shards via `gpufeed pack --resize`, reduced-size JPEG decode" + gpu
    return (
        "preprocess once ahead of time (tokenize, parse, cache the tensors) and keep only cheap "
        "per-sample work in the loader"
    )
