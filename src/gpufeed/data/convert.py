"""Images converted for `gpufeed pack`, in a pool of processes: each input read, checked and, where
needed, decoded, resized and re-encoded as an RGB JPEG (`convert`); `convert_all` yields them in
input order. Conversions run in at most `4 * usable_cores()` processes, and never more than
images."""

from __future__ import annotations

import io
import math
import os
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gpufeed.cores import usable_cores
from gpufeed.data.decode import CorruptImage, decode, error_reason, is_jpeg, to_rgb
from gpufeed.data.listing import Item, special


def _encode(arr: np.ndarray, quality: int) -> bytes:
    """`arr` (RGB) as JPEG bytes at `quality`, 4:2:0 as most readers decode fastest."""
    import simplejpeg

    return simplejpeg.encode_jpeg(
        np.ascontiguousarray(arr), quality=quality, colorsubsampling="420"
    )


def _resize_short(arr: np.ndarray, short: int) -> np.ndarray:
    """`arr` resized (bilinear) so that its short side is `short` pixels."""
    from PIL import Image

    h, w = arr.shape[:2]
    s = short / min(h, w)
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return np.asarray(Image.fromarray(arr).resize(size, Image.BILINEAR))


def convert(path: str, resize: int | None, quality: int, verify: bool) -> tuple[str, bytes, str]:
    """(status, jpeg bytes, reason) for one input; status is 'ok', 'converted' or 'skipped'."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # reading a FIFO would block forever
            return "skipped", b"", f"{special(st)}, not an image file"
        data = Path(path).read_bytes()
    except OSError as e:
        return "skipped", b"", f"unreadable: {e.strerror or e}"
    if not data:
        return "skipped", b"", "empty file"
    jpeg_ok = False
    if is_jpeg(data):
        import simplejpeg

        try:
            h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            jpeg_ok = colorspace in ("YCbCr", "RGB")
        except ValueError:
            jpeg_ok = False
    status, why = "ok", ""
    if jpeg_ok:
        needs_resize = resize is not None and min(h, w) > resize
        if not needs_resize and not verify:
            return status, data, why
        try:
            if needs_resize:
                assert resize is not None
                s = resize / min(h, w)
                arr = decode(data, min_height=math.ceil(h * s), min_width=math.ceil(w * s))
            else:
                arr = decode(data)
        except CorruptImage as e:
            return "skipped", b"", f"corrupt JPEG: {e}"
        if not needs_resize:
            return status, data, why
    else:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                why = f"converted {im.format} {im.mode} to RGB JPEG"
                arr = to_rgb(im)
        except Exception as e:
            return "skipped", b"", f"not a readable image: {type(e).__name__}: {error_reason(e)}"
        status = "converted"
    if resize is not None and min(arr.shape[:2]) > resize:
        arr = _resize_short(arr, resize)
    return status, _encode(arr, quality), why


def _convert_item(args: tuple[Item, int | None, int, bool]) -> tuple[Item, str, bytes, str]:
    """`convert` of one item, as a pool calls it (one argument; the item comes back with it)."""
    item, resize, quality, verify = args
    status, data, reason = convert(item.path, resize, quality, verify)
    return item, status, data, reason


def pool_size(workers: int | None, items: int) -> int:
    """How many processes convert `items` images: `workers` (default: every usable core), but
    never more than the images, nor more than 4 per usable core (reads from network storage
    wait more than they compute; more processes than that only cost memory and start-up)."""
    cores = usable_cores()
    return max(1, min(workers or cores, 4 * cores, items))


def convert_all(
    items: list[Item], resize: int | None, quality: int, verify: bool, workers: int | None
) -> Iterator[tuple[Item, str, bytes, str]]:
    """(item, status, jpeg bytes, reason) of each item, in order: converted in this process when
    there are few, else in a pool of `pool_size` processes (spawned if threads run here)."""
    args = [(it, resize, quality, verify) for it in items]
    workers = pool_size(workers, len(items))
    if workers <= 1 or len(items) < 8:
        yield from map(_convert_item, args)
        return
    import multiprocessing as mp

    from gpufeed.data.forking import frozen_heap

    with frozen_heap():
        context = mp.get_context("spawn" if _threads_started() else "fork")
        pool = context.Pool(workers, initializer=_default_sigterm)
    with pool:
        yield from pool.imap(_convert_item, args, chunksize=4)


def _default_sigterm() -> None:
    """In a conversion process: SIGTERM ends it (as `Pool.terminate` expects), not the pack's
    handler a fork inherits (see `open_shard.sigterm_exits`)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _threads_started() -> bool:
    """True when this process runs other threads: forking it then could copy a held lock."""
    return threading.active_count() > 1
