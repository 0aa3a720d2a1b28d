"""`gpufeed pack`: turn an image folder or list file into tar shards plus an index
(gpufeed-index.json).

Policy for bad input (nothing is dropped silently: every case is listed by path and reason in
the summary):
- unreadable, zero-byte or non-image files, JPEGs that fail `verify`, broken symlinks, FIFOs and
  other non-regular files, files outside a class folder: skipped;
- hidden files and folders (`.DS_Store`, `.gpufeed-synth.json`, `.git/`): ignored, not listed;
- unreadable folders: skipped, with a warning (their images are missing from the pack);
- classes with no packed image (an empty folder, every file skipped): kept, so labels stay the
  sorted folder names' numbers (as torchvision's `ImageFolder(allow_empty=True)`); listed;
- PNG/other formats and grayscale/CMYK JPEGs: converted to RGB JPEG at `quality` (16-bit images
  are scaled to 8 bits, not clipped);
- duplicate keys (two inputs mapping to the same key) and repeated list entries: the first
  wins, later ones are skipped;
- malformed list-file lines: skipped; numeric labels must be class numbers 0..1,000,000
  (a negative or larger one is a PackError naming the line); SRC and the files a list names
  must be local (a URL is a PackError: copy the images first);
- file and folder names that are not UTF-8: packed (keys keep only ASCII letters, digits, `_`
  and `-`); such a class name is stored with its odd bytes written `\\xNN`.
The full skipped list is also written to `pack-skipped.txt` in DST (the summary shows 50).
A pack in which every input was skipped is a PackError and writes nothing. Bad options, an
unreadable or binary list file, a DST that cannot be a folder or lies inside the SRC folder and
S3 failures (no bucket in the URL, missing bucket, no credentials, unreachable endpoint: see
`source`) are one-line PackErrors; a failed pack leaves no temporary shard behind.
Samples are shuffled (with `seed`) before sharding so every shard mixes classes. Shards are
written under a temporary name and renamed when complete; a journal makes an interrupted pack
resumable: one small record per finished shard (`.pack-state.NNNNN.json`; older versions
rewrote one `.pack-state.json` whole after every shard, which is still read); the index is
written last. SIGTERM ends a pack as Ctrl-C does, removing its temporary shard. A finished pack is
not redone, unless a shard its index lists is missing or has the wrong size: then it is packed
again. Conversions run in at most `4 * usable_cores()` processes, and never more than images.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import signal
import stat
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.cores import usable_cores
from gpufeed.data.decode import CorruptImage, decode, error_reason, is_jpeg, to_rgb
from gpufeed.data.shards import (
    INDEX_NAME,
    MAX_LABEL,
    Index,
    ShardEntry,
    ShardError,
    ShardWriter,
    shard_name,
)
from gpufeed.data.source import Destination, base_url, is_remote
from gpufeed.errors import GpufeedError
from gpufeed.text import count, figure, valid_text, visible

STATE_NAME = ".pack-state.json"  # the journal of older versions (`.done`: a finished pack's mark)
SKIPPED_NAME = "pack-skipped.txt"
_SHARD_FILE = r"shard-\d{5,}\.tar"  # the names `shard_name` gives
# the files a pack writes in DST (shards, index, journal records, the skipped list)
_PACK_FILES = re.compile(
    rf"{_SHARD_FILE}|gpufeed-index\.json|\.pack-state(?:\.\d{{5,}})?\.json(?:\.done)?"
    r"|pack-skipped\.txt"
)
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*((?:[kmgt]i?)?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


class PackError(GpufeedError, ValueError):
    """Bad pack input or options; the message says which and what to do."""


class OtherPackError(PackError):
    """DST holds a pack of other inputs or options (`repack_cache` replaces it)."""


class NothingPacked(PackError):
    """Every input was skipped; `skipped` lists them (path, why)."""

    def __init__(self, message: str, skipped: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.skipped = skipped


def parse_size(text: str | int) -> int:
    """Bytes from '64MB', '512KiB', '1.5G' or a plain number of bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise PackError(f"cannot read size {text!r}: use e.g. 64MB, 512KB or a number of bytes")
    unit = (m.group(2) or "").lower()
    factor = _UNITS[unit[:1]] if "i" not in unit else 1024 ** "bkmgt".index(unit[0])
    n = int(float(m.group(1)) * factor)
    if float(m.group(1)) > 0 and n < 1:
        raise PackError(f"size {text!r} is less than one byte: give e.g. 64MB")
    return n


@dataclass
class PackResult:
    """What a pack wrote and what it converted or skipped, by path."""

    dst: str
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    classes: int = 0
    empty_classes: list[str] = field(default_factory=list)  # classes no packed image has
    resumed_shards: int = 0
    already_packed: bool = False
    repacked: str = ""  # why a finished pack in DST was packed again ('' if it was not)
    converted: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    skipped_file: str = ""  # where the whole skipped list was written ('' if nothing was skipped)

    def summary(self) -> str:
        """What was written, converted and skipped, printable whatever the file names (control
        characters in them shown as escapes, not sent to the terminal)."""
        if self.already_packed:
            return (
                f"{visible(self.dst)} already holds this pack: {count(self.samples, 'image')} in "
                f"{count(self.shards, 'shard')}"
            )
        lines = [
            f"wrote {count(self.samples, 'image')} in {count(self.shards, 'shard')} "
            f"({self.bytes / 1e6:.1f} MB, {count(self.classes, 'class')}) to {visible(self.dst)}"
            + (
                f"; resumed after {count(self.resumed_shards, 'finished shard')}"
                if self.resumed_shards
                else ""
            )
        ]
        if self.repacked:
            lines.append(f"packed again: {visible(self.repacked)}")
        if self.empty_classes:
            names = ", ".join(visible(c) for c in self.empty_classes[:10])
            more = len(self.empty_classes) - 10
            lines.append(
                f"no image packed for {count(len(self.empty_classes), 'class')}: {names}"
                + (f" and {more} more" if more > 0 else "")
                + " (an empty folder, every file skipped, or a label number no line has); "
                "their label numbers are kept, so the others match the class list"
            )
        for title, rows in (("converted", self.converted), ("skipped", self.skipped)):
            if rows:
                lines.append(f"{title} {len(rows)}:")
                lines += [f"  {visible(p)}: {visible(why)}" for p, why in rows[:50]]
                if len(rows) > 50:
                    lines.append(f"  ... and {len(rows) - 50} more")
        if self.skipped_file:
            lines.append(f"  every skipped file and why: {visible(self.skipped_file)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Item:
    path: str
    key: str
    label: int


def printable(name: str) -> str:
    """`name` as a message shows it (`gpufeed.text.visible`): the bytes of a file name that is not
    UTF-8 (which Python holds as lone surrogates) written as `\\xNN`, control, bidi and zero-width
    characters as escapes."""
    return visible(name)


def _key_for(rel: str) -> str:
    """The sample key of relative name `rel`: its path without the extension, in letters, digits,
    `_` and `-` (what every WebDataset reader accepts); where two names give one key, the later
    one gets a hash of its name added."""
    stem = rel.rsplit(".", 1)[0] if "." in Path(rel).name else rel
    return re.sub(r"[^A-Za-z0-9_-]", "_", stem).strip("_") or "x"


def _special(st: os.stat_result) -> str:
    """What a non-regular file is, for the skipped list."""
    for test, what in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(st.st_mode):
            return what
    return "not a regular file"


def _walk_class(root: Path, d: Path, skipped: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(path, relative name, class) of every regular file under class folder `d`; every other
    entry (unreadable folder, broken or folder symlink, FIFO...) goes to `skipped`; hidden files
    and folders are ignored."""
    rows: list[tuple[str, str, str]] = []

    def unreadable(e: OSError) -> None:
        skipped.append((str(e.filename or d), f"unreadable folder: {e.strerror or e}"))
        warnings.warn(
            f"{visible(e.filename or d)}: unreadable folder ({e.strerror or e}), its images are not "
            "packed; fix its permissions and pack again",
            stacklevel=3,
        )

    for top, dirs, files in os.walk(d, onerror=unreadable):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(top, name)):
                skipped.append((os.path.join(top, name), "symbolic link to a folder: not followed"))
        dirs[:] = sorted(
            n for n in dirs if not n.startswith(".") and not os.path.islink(os.path.join(top, n))
        )
        for name in sorted(n for n in files if not n.startswith(".")):
            path = os.path.join(top, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                skipped.append((path, "broken symbolic link"))
                continue
            except OSError as e:
                skipped.append((path, f"unreadable: {e.strerror or e}"))
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append((path, f"{_special(st)}, not an image file"))
                continue
            rows.append((path, os.path.relpath(path, root), d.name))
    return rows


def _read_list(src: Path) -> str:
    """The text of list file `src`, or a PackError when it is unreadable or binary."""
    try:
        data = src.read_bytes()
    except OSError as e:
        raise PackError(
            f"cannot read list file {src}: {e.strerror or e}; check that it is a readable file"
        ) from None
    if b"\0" in data[:65536]:
        raise PackError(
            f"list file {src} is binary, not text: give an image folder or a text file of "
            "'PATH LABEL' lines"
        )
    return data.decode("utf-8", errors="surrogateescape")  # non-UTF-8 paths still open


def _list_labels(src: Path, labels: list[tuple[int, str]]) -> list[str]:
    """Class names for the labels of a list file: numbers 0..max when every label is a number
    (a negative or absurdly large one is a PackError naming its line), else the sorted names.
    Numbers beside a few names (a header line, `path,label`) are a PackError naming the line:
    read as names, 2 and 10 would sort as '10' < '2' and every label would change."""
    numeric = [re.fullmatch(r"[+-]?\d+", x) is not None for _, x in labels]
    if any(numeric) and not all(numeric) and sum(numeric) > len(numeric) // 2:
        n, x = next(label for label, ok in zip(labels, numeric, strict=True) if not ok)
        raise PackError(
            f"{src}:{n}: label {x!r} is not a number, but {sum(numeric):,} other lines' labels "
            "are class numbers (a header line?): delete the line or start it with #"
        )
    if not labels or not all(numeric):
        return sorted({x for _, x in labels})
    for n, x in labels:
        if int(x) < 0:
            raise PackError(
                f"{src}:{n}: label {x} is negative: numeric labels are class numbers 0, 1, 2, ...; "
                "fix the line or use class names"
            )
        if int(x) > MAX_LABEL:
            raise PackError(
                f"{src}:{n}: label {x} is over {MAX_LABEL:,}: numeric labels are class numbers "
                "0..N-1 (is the column order PATH LABEL?); fix the line or use class names"
            )
    return [str(i) for i in range(max(int(x) for _, x in labels) + 1)]


def _split_line(line: str, base: Path) -> tuple[Path, str] | None:
    """(path, label) of a list-file line: the label is the last field, after a tab, a comma or
    spaces; paths may hold commas and spaces. A line with both a comma and spaces splits where
    the path names a file (`a,b.jpg cat`, `c d.jpg,dog`), else at the last comma."""
    if "\t" in line:
        splits = [line.rpartition("\t")[::2]]
    else:
        splits = [line.rpartition(",")[::2]] if "," in line else []
        spaced = re.fullmatch(r"(.*?\S)\s+(\S+)", line)
        if spaced and not spaced[2].startswith(","):
            splits.append((spaced[1].rstrip(","), spaced[2]))
    found = []
    for path, label in splits:
        path, label = path.strip(), label.strip()
        if path and label:
            full = Path(path) if Path(path).is_absolute() else base / path
            found.append((full, label))
    if len(found) > 1:
        return next((f for f in found if os.path.lexists(f[0])), found[0])
    return found[0] if found else None


def list_inputs(
    src: str | os.PathLike[str],
) -> tuple[list[_Item], list[str], list[tuple[str, str]]]:
    """Items (path, key, label), class names, and (path, reason) rows skipped while listing."""
    if is_remote(os.fspath(src)):  # before Path(), which makes `s3://b/x` a local `s3:/b/x`
        raise PackError(
            f"SRC {visible(os.fspath(src))} is a URL: SRC must be a local folder or a list "
            f"file of local images; {_COPY_FIRST} and pack that folder"
        )
    src = Path(src)
    skipped: list[tuple[str, str]] = []
    rows: list[tuple[str, str, str]] = []  # (path, relative name, class)
    if src.is_dir():
        try:
            entries = sorted(src.iterdir())
        except OSError as e:
            raise PackError(
                f"cannot read SRC folder {src}: {e.strerror or e}; check its permissions"
            ) from None
        class_dirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
        if not class_dirs:
            raise PackError(f"{src} has no class sub-folders: expected SRC/<class>/<image> files")
        for p in entries:
            if p not in class_dirs and not p.name.startswith("."):
                broken = p.is_symlink() and not p.exists()  # a class folder's link, maybe
                skipped.append(
                    (str(p), "broken symbolic link" if broken else "not in a class sub-folder")
                )
        for d in class_dirs:
            rows += _walk_class(src, d, skipped)
        classes = [d.name for d in class_dirs]
    elif src.is_file():
        labels: list[tuple[int, str]] = []
        for n, line in enumerate(_read_list(src).splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if is_remote(line):
                raise PackError(
                    f"{visible(src)}:{n}: '{visible(line)}' names a URL: a list file "
                    f"must name local image files; {_COPY_FIRST} and list their local paths"
                )
            parts = _split_line(line, src.parent)
            if parts is None:
                skipped.append((f"{src}:{n}", "malformed line: expected 'PATH LABEL'"))
                continue
            rows.append((str(parts[0]), "", parts[1]))
            labels.append((n, parts[1]))
        if rows:  # keys: paths relative to the deepest folder holding all listed files
            common = os.path.commonpath([os.path.dirname(os.path.abspath(r[0])) for r in rows])
            rows = [(p, os.path.relpath(os.path.abspath(p), common), c) for p, _, c in rows]
        classes = _list_labels(src, labels)
    elif src.exists():
        raise PackError(
            f"SRC {src} is neither a folder nor a regular file: give an image folder or a list file"
        )
    else:
        raise PackError(f"SRC {src} does not exist: give an image folder or a list file")
    class_index = {c: i for i, c in enumerate(classes)}
    classes = _class_names(src, classes)
    items: list[_Item] = []
    seen_paths: set[str] = set()
    seen_keys: dict[str, str] = {}
    for path, rel, cls in rows:
        if path in seen_paths:
            skipped.append((path, "listed twice; first entry kept"))
            continue
        seen_paths.add(path)
        key = _key_for(rel)
        if key in seen_keys:  # another name cleaned to the same key: a.jpg, a.jpeg, "a b", 猫
            key = f"{key}_{hashlib.blake2b(_as_bytes(rel), digest_size=5).hexdigest()}"
        if key in seen_keys:
            skipped.append((path, f"duplicate key {key!r} (same as {seen_keys[key]}); first kept"))
            continue
        seen_keys[key] = path
        label = class_index[cls] if cls in class_index else int(cls)
        items.append(_Item(path, key, label))
    return items, classes, skipped


_COPY_FIRST = "copy the images to a local folder first (e.g. `aws s3 sync s3://BUCKET/PREFIX DIR`)"


def _class_names(src: Path, raw: list[str]) -> list[str]:
    """The class names as stored in the index (`gpufeed.text.valid_text`); a PackError when two
    names become one."""
    names = [valid_text(c) for c in raw]
    seen: dict[str, str] = {}
    for name, c in zip(names, raw, strict=True):
        if name in seen:
            first, second = (_as_bytes(x) for x in (seen[name], c))
            raise PackError(
                f"{visible(src)}: the class names {first!r} and {second!r} (as bytes) "
                f"would both be stored as {name!r}: rename one of them"
            )
        seen[name] = c
    return names


def _as_bytes(name: str) -> bytes:
    """The bytes of a name as the file system or list file gave them."""
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace")


def _encode(arr: np.ndarray, quality: int) -> bytes:
    import simplejpeg

    return simplejpeg.encode_jpeg(
        np.ascontiguousarray(arr), quality=quality, colorsubsampling="420"
    )


def _resize_short(arr: np.ndarray, short: int) -> np.ndarray:
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
            return "skipped", b"", f"{_special(st)}, not an image file"
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


def _convert_item(args: tuple[_Item, int | None, int, bool]) -> tuple[_Item, str, bytes, str]:
    item, resize, quality, verify = args
    status, data, reason = convert(item.path, resize, quality, verify)
    return item, status, data, reason


def _signatures(items: list[_Item], classes: list[str], options: dict[str, Any]) -> tuple[str, str]:
    """(signature, legacy signature) of a pack's inputs and options. The signature hashes each
    image's absolute path, so a re-run that names SRC by another path (relative, absolute) is the
    same pack; packs written before that hashed the paths as given, which the legacy one matches."""
    sigs = []
    for absolute in (True, False):
        h = hashlib.sha256(json.dumps([classes, options]).encode())
        for it in items:  # file names as bytes: also those that are not UTF-8
            path = os.path.abspath(it.path) if absolute else it.path
            h.update(os.fsencode(path) + f"\0{it.key}\0{it.label}\n".encode())
        sigs.append(h.hexdigest())
    return sigs[0], sigs[1]


def pack_cache(src: str | os.PathLike[str], dst: Path, **options: Any) -> PackResult:
    """`pack` into a local folder that gpufeed owns (the demo's or a benchmark's cache): a pack
    of other inputs found there (its images were moved or changed) is removed and packed anew."""
    import shutil

    try:
        return pack(src, dst, **options)
    except OtherPackError:
        shutil.rmtree(dst)
        return pack(src, dst, **options)


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    shard_size: int | str = "64MB",
    resize: int | None = None,
    quality: int = 90,
    workers: int | None = None,
    verify: bool = False,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> PackResult:
    """Pack SRC (image folder or list file) into shards + gpufeed-index.json at DST (directory
    or s3://)."""
    target = parse_size(shard_size)
    if target <= 0:
        raise PackError(f"--shard-size must be positive, got {shard_size!r}")
    if not 1e6 <= target <= 128e6:
        warnings.warn(
            f"shard size {target / 1e6:g} MB is outside 1-128 MB: tiny objects are slow to fetch "
            "(per-request latency dominates), huge ones cannot be fetched in parallel and "
            "delay the start of training",
            stacklevel=2,
        )
    if resize is not None and resize < 8:
        raise PackError(f"--resize must be a short side of at least 8 pixels, got {resize}")
    if not 1 <= quality <= 100:
        raise PackError(f"--quality must be 1-100, got {quality}")
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise PackError(
            f"--workers must be 1 or more (leave it out to use every core), got {workers!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise PackError(
            f"--seed must be a whole number, 0 or more (it orders the samples across shards), "
            f"got {seed!r}"
        )
    seed = int(seed)
    try:
        base_url(dst)  # before SRC is listed: `s3://` names no bucket
    except ShardError as e:
        raise PackError(str(e)) from None
    _check_dst_outside(src, dst)
    items, classes, listing_skipped = list_inputs(src)
    if not items:
        raise PackError(f"no images found in {src}{_examples(listing_skipped)}")
    order = np.random.default_rng(seed).permutation(len(items))
    items = [items[i] for i in order]
    options = {
        "shard_size": target,
        "resize": resize,
        "quality": quality,
        "verify": verify,
        "seed": seed,
    }
    sigs = _signatures(items, classes, options)
    existed = is_remote(str(dst)) or os.path.exists(dst)
    try:
        with _sigterm_exits():
            return _pack_into(dst, src, items, classes, listing_skipped, options, sigs,
                              storage_options, workers, progress)  # fmt: skip
    except ShardError as e:
        raise PackError(str(e)) from None
    except OSError as e:
        raise PackError(
            f"cannot write {e.filename or dst}: {e.strerror or e}; DST must be a writable folder "
            "(created if missing) or s3://bucket/prefix"
        ) from None
    finally:
        if not existed:  # a pack that wrote nothing leaves no empty DST behind
            with contextlib.suppress(OSError):
                os.rmdir(dst)


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """Within: SIGTERM (`kill`, a batch scheduler's stop) raises SystemExit(143), as Ctrl-C
    raises KeyboardInterrupt, so the pack removes its temporary shard on the way out (for an
    s3:// DST a file of up to a shard's size in the temporary folder, which nothing else
    removes). Only in the main thread, and only where SIGTERM has its default action (a
    program's own handler is kept); a second SIGTERM ends the process at once."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Within: Ctrl-C and SIGTERM wait until the block ends, then act as they would have. A
    signal's handler runs between any two bytecodes, so one that came between creating a
    temporary file and holding it in a variable would leave the file where no clean-up finds
    it. Only in the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        held.append(signum)

    kept = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(s)
        if callable(handler):  # not SIG_DFL / SIG_IGN, nor one set outside Python (None)
            kept[s] = signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(held):
            kept[s](s, None)  # raises KeyboardInterrupt or SystemExit: the caller cleans up


def _check_dst_outside(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """A PackError when DST is the SRC folder or inside it: its shards would be listed as a
    class of images by the next pack of SRC (and make that pack differ from this one)."""
    if is_remote(str(dst)) or not os.path.isdir(src):
        return
    source, target = Path(src).resolve(), Path(dst).resolve()
    if target == source or target.is_relative_to(source):
        raise PackError(
            f"DST {visible(dst)} is inside the SRC folder {visible(src)}: its "
            "shards would become a class of images when SRC is packed again; give a DST "
            "outside SRC"
        )


def _examples(skipped: list[tuple[str, str]]) -> str:
    """' (N inputs skipped, e.g. PATH: REASON)' for an error message, or ''."""
    if not skipped:
        return ""
    path, why = skipped[0]
    return f" ({len(skipped)} inputs skipped, e.g. {visible(path)}: {visible(why)})"


def _pack_into(
    dst: str | os.PathLike[str],
    src: str | os.PathLike[str],
    items: list[_Item],
    classes: list[str],
    listing_skipped: list[tuple[str, str]],
    options: dict[str, Any],
    sigs: tuple[str, str],
    storage_options: dict[str, Any] | None,
    workers: int | None,
    progress: bool,
) -> PackResult:
    """The pack itself, after its inputs and options were checked."""
    target, resize, quality, verify = (
        options["shard_size"], options["resize"], options["quality"], options["verify"]
    )  # fmt: skip
    out = Destination(dst, storage_options)
    out.check()
    result = PackResult(dst=str(dst), classes=len(classes))
    sig = sigs[0]
    journal = _load_journal(out, sigs)
    owned = journal is not None or out.exists(INDEX_NAME)  # shards in DST are a pack's
    if not owned:
        _refuse_foreign_shards(out)
    if journal is None and owned:
        done = _existing_index(out, sigs)
        if done is None:
            raise OtherPackError(
                f"{out.path(INDEX_NAME)} exists from a different pack (other inputs or options); "
                "use a new DST or delete the old pack first"
            )
        if not done.repacked:
            return done
        result.repacked = done.repacked
        out.remove(INDEX_NAME)  # first: no index may list shards that are being rewritten
        out.remove(STATE_NAME + ".done")
    out.remove_stale_tmp(_PACK_FILES)
    journal = journal or _Journal()
    entries, consumed = journal.entries, journal.consumed
    result.converted = journal.converted
    result.skipped = listing_skipped + journal.skipped
    result.resumed_shards = len(entries)

    writer: _OpenShard | None = None
    skipped: list[tuple[str, str]] = []  # since the last finished shard
    converted: list[tuple[str, str]] = []
    try:
        with _progress(progress, len(items), consumed) as advance:
            work = _run(items[consumed:], resize, quality, verify, workers)
            for n, (item, status, data, reason) in enumerate(work, start=consumed + 1):
                advance()
                if status == "skipped":
                    skipped.append((item.path, reason))
                    continue
                if status == "converted":
                    converted.append((item.path, reason))
                if writer is None:
                    with _signals_deferred():  # the temporary file is `writer`'s before a stop
                        writer = _OpenShard(out, len(entries))
                writer.writer.add(item.key, data, "jpg", item.label)
                if writer.writer.size >= target:
                    entries.append(writer.finish())
                    writer = None
                    _save_record(out, sig, len(entries) - 1, entries[-1], n, converted, skipped)
                    result.skipped += skipped
                    result.converted += converted
                    skipped, converted = [], []
            if writer is not None:
                entries.append(writer.finish())
                writer = None
    finally:
        if writer is not None:  # failed or interrupted: no partial shard is left anywhere
            writer.discard()
    result.skipped += skipped
    result.converted += converted
    if not entries:
        raise NothingPacked(
            f"nothing packed from {src}: all {len(items)} images were skipped"
            f"{_examples(result.skipped)}; fix or remove them and pack again",
            result.skipped,
        )
    result.skipped_file = _write_skipped(out, result.skipped)
    index = Index(classes=classes, shards=entries)
    out.write_bytes(INDEX_NAME, index.to_bytes())
    out.write_bytes(STATE_NAME + ".done", json.dumps({"signature": sig}).encode())
    _drop_journal(out, len(entries))
    result.samples, result.shards = index.total, len(entries)
    result.bytes = sum(e.bytes for e in entries)
    result.empty_classes = _empty_classes(index)
    return result


def _write_skipped(out: Destination, skipped: list[tuple[str, str]]) -> str:
    """Write every skipped input and why, a line each, to SKIPPED_NAME in DST (the summary
    shows only the first 50); returns its path, or '' (and removes an older one) when nothing
    was skipped."""
    if not skipped:
        out.remove(SKIPPED_NAME)
        return ""
    text = "".join(f"{visible(p)}: {visible(why)}\n" for p, why in skipped)
    out.write_bytes(SKIPPED_NAME, text.encode())
    return out.path(SKIPPED_NAME)


def _empty_classes(index: Index) -> list[str]:
    """The names of the classes in `index` that none of its samples has."""
    labels = [np.asarray(e.labels) for e in index.shards]
    used = set(np.unique(np.concatenate(labels)).tolist()) if labels else set()
    return [c for i, c in enumerate(index.classes) if i not in used]


class _OpenShard:
    """A shard being written under a temporary name."""

    def __init__(self, out: Destination, number: int) -> None:
        self.out, self.name = out, shard_name(number)
        self.tmp = out.local_tmp(self.name)
        self.file = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish()
        self.writer = ShardWriter(self.file, self.name)

    def discard(self) -> None:
        """Close and delete the unfinished shard."""
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)

    def finish(self) -> ShardEntry:
        from gpufeed.data.shards import sha256_file

        entry = self.writer.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        entry.bytes = os.path.getsize(self.tmp)
        entry.sha256 = sha256_file(self.tmp)
        self.out.put_file(self.tmp, self.name)  # the temporary file is gone after, also on error
        return entry


def pool_size(workers: int | None, items: int) -> int:
    """How many processes convert `items` images: `workers` (default: every usable core), but
    never more than the images, nor more than 4 per usable core (reads from network storage
    wait more than they compute; more processes than that only cost memory and start-up)."""
    cores = usable_cores()
    return max(1, min(workers or cores, 4 * cores, items))


def _run(
    items: list[_Item], resize: int | None, quality: int, verify: bool, workers: int | None
) -> Iterator[tuple[_Item, str, bytes, str]]:
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
    handler a fork inherits (see `_sigterm_exits`)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _threads_started() -> bool:
    return threading.active_count() > 1


class _progress:
    """Progress on stderr, used as `with _progress(...) as advance:`: a rich bar on a terminal,
    plain lines (`_Lines`) where stderr is a file or a pipe, or nothing."""

    def __init__(self, enabled: bool, total: int, done: int) -> None:
        self.enabled, self.total, self.done = enabled, total, done
        self.bar: Any = None

    def __enter__(self) -> Any:
        if not self.enabled:
            return lambda: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        console = Console(stderr=True)  # stdout keeps only the summary, e.g. for a file
        if not console.is_terminal:
            return _Lines(self.total, self.done).advance
        self.bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
            console=console,
        )
        self.bar.__enter__()
        task = self.bar.add_task("packing", total=self.total, completed=self.done)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


LINE_EVERY_S = 30.0  # seconds between two plain progress lines (also one per 10% of the images)


class _Lines:
    """Progress as a plain stderr line every LINE_EVERY_S seconds and every 10% of the images
    (done/total, rate, time left), for a batch job's or CI's log, where a live bar shows
    nothing."""

    def __init__(self, total: int, done: int) -> None:
        self.total, self.done, self.first = total, done, done
        self.start = self.last = time.monotonic()
        self.mark = self._next_mark()
        self.shown = True  # False once stderr is gone (a closed pipe): the pack goes on

    def _next_mark(self) -> int:
        """The next count of images that is a whole 10% of the total."""
        return math.ceil(self.total * (self.done * 10 // self.total + 1) / 10)

    def advance(self) -> None:
        self.done += 1
        now = time.monotonic()
        if not self.shown or (self.done < self.mark and now - self.last < LINE_EVERY_S):
            return
        self.last, self.mark = now, self._next_mark()
        rate = (self.done - self.first) / max(now - self.start, 1e-9)
        line = (
            f"packing: {self.done:,}/{self.total:,} images ({100 * self.done // self.total}%), "
            f"{figure(rate)} images/s"
        )
        if self.done < self.total:
            line += f", about {_duration((self.total - self.done) / rate)} left"
        try:
            print(line, file=sys.stderr, flush=True)
        except OSError:  # `pack ... 2>&1 | head`: the reader left; progress is not worth a stop
            self.shown = False


def _duration(seconds: float) -> str:
    """'45 s', '12 min' or '3.4 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@dataclass
class _Journal:
    """What an interrupted pack of the same inputs finished: its shards, how many inputs they
    consumed, and what was converted or skipped on the way (listing's skips aside)."""

    entries: list[ShardEntry] = field(default_factory=list)
    consumed: int = 0
    converted: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def add(self, record: dict[str, Any], shards: Any) -> bool:
        """Take in a journal file's `shards` and what it says was consumed, converted and
        skipped; False, taking nothing, when it is malformed."""
        try:
            entries = [ShardEntry.from_json(e) for e in shards]
            consumed = int(record["consumed"])
            converted = [(str(p), str(why)) for p, why in record.get("converted", [])]
            skipped = [(str(p), str(why)) for p, why in record.get("skipped", [])]
        except (ValueError, KeyError, TypeError):
            return False
        self.entries += entries
        self.consumed = consumed
        self.converted += converted
        self.skipped += skipped
        return True


def _refuse_foreign_shards(out: Destination) -> None:
    """An OtherPackError when DST holds shard files that no pack journal or index owns (another
    tool's `shard-%05d.tar`, a pack whose index was deleted): packing would write over them,
    and a later `gpufeed index` would mix the rest in."""
    try:
        names = sorted(n for n in out.sizes() if re.fullmatch(_SHARD_FILE, n))
    except (FileNotFoundError, ShardError):  # no DST yet
        return
    if names:
        more = f" (and {len(names) - 1} more shard files)" if len(names) > 1 else ""
        raise OtherPackError(
            f"{out.path(names[0])}{more} already exists, and no gpufeed index or pack journal "
            "in DST owns it: packing would write over it; use an empty DST, or move the "
            "shards away first"
        )


def record_name(number: int) -> str:
    """The journal record of finished shard `number`: a small file per shard, so what the
    journal writes grows with the data set (rewriting one file after every shard, as older
    versions did, grew with its square: ~100 GB for ImageNet)."""
    return f".pack-state.{number:05d}.json"


def _load_journal(out: Destination, sigs: tuple[str, ...]) -> _Journal | None:
    """The journal of an interrupted pack in DST: an older version's `.pack-state.json`, then
    the records of the shards after it, as far as they are whole; None when there is none."""
    legacy = _load_legacy(out, sigs)
    journal = legacy or _Journal()
    if not out.exists(record_name(len(journal.entries))):  # one request where there is none
        return legacy
    names = out.sizes()
    while (name := record_name(len(journal.entries))) in names:
        record = _read_journal(out, name, sigs)
        if record is None or not journal.add(record, [record.get("shard")]):
            break  # unreadable: this shard and the ones after it are packed again
    return journal if legacy or journal.entries else None


def _load_legacy(out: Destination, sigs: tuple[str, ...]) -> _Journal | None:
    """The journal an older version left (one file with every finished shard), or None."""
    state = _read_journal(out, STATE_NAME, sigs) if out.exists(STATE_NAME) else None
    if state is None:
        return None
    journal = _Journal()
    return journal if journal.add(state, state.get("shards")) else None


def _read_journal(out: Destination, name: str, sigs: tuple[str, ...]) -> dict[str, Any] | None:
    """Journal file `name` as a dict; None when it is not JSON; a PackError when it is from a
    pack of other inputs or options."""
    try:
        state = json.loads(out.read_bytes(name))
    except ValueError:
        return None
    if not isinstance(state, dict):
        return None
    if state.get("signature") not in sigs:
        raise PackError(
            f"{out.path(name)}: an unfinished pack from different inputs or options is in "
            "this destination; use a new DST or delete that pack there first"
        )
    return state


def _save_record(
    out: Destination,
    sig: str,
    number: int,
    entry: ShardEntry,
    consumed: int,
    converted: list[tuple[str, str]],
    skipped: list[tuple[str, str]],
) -> None:
    """Record finished shard `number`: it, the inputs consumed so far, and what was converted
    or skipped since the shard before."""
    record = {
        "signature": sig,
        "consumed": consumed,
        "shard": entry.to_json(),
        "converted": converted,
        "skipped": skipped,
    }
    out.write_bytes(record_name(number), json.dumps(record).encode())


def _drop_journal(out: Destination, shards: int) -> None:
    """Remove the journal of a finished pack of `shards` shards."""
    out.remove(STATE_NAME)
    for number in range(shards):
        out.remove(record_name(number))


def _existing_index(out: Destination, sigs: tuple[str, ...]) -> PackResult | None:
    """A finished pack of the same inputs and options: report it instead of packing again, or,
    when a shard its index lists is missing or has another size, say so in `repacked`."""
    done = STATE_NAME + ".done"
    if not out.exists(done) or _done_signature(out, done) not in sigs:
        return None
    index = Index.from_bytes(out.read_bytes(INDEX_NAME), out.path(INDEX_NAME))
    sizes = out.sizes()
    broken = [
        f"{e.name} is missing"
        if e.name not in sizes
        else f"{e.name} is {sizes[e.name]} bytes, not {e.bytes}"
        for e in index.shards
        if sizes.get(e.name) != e.bytes
    ]
    return PackResult(
        dst=out.url,
        samples=index.total,
        shards=len(index.shards),
        bytes=sum(e.bytes for e in index.shards),
        classes=len(index.classes),
        empty_classes=_empty_classes(index),
        already_packed=not broken,
        repacked=(
            f"{out.url} held this pack, but shard {broken[0]}"
            + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else "")
            if broken
            else ""
        ),
    )


def _done_signature(out: Destination, done: str) -> Any:
    """The signature a finished pack recorded; None when its marker cannot be read."""
    try:
        return json.loads(out.read_bytes(done)).get("signature")
    except (ValueError, AttributeError):
        return None
