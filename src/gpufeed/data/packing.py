"""`gpufeed pack`: turn an image folder or list file into tar shards plus an index
(gpufeed-index.json), resumably, listing every input it skips and why. What it does with each
kind of bad input is documented in docs/reference/shards.md and checked by tests/data/test_packing.py.

Here: `pack` and its summary. Its parts: `listing` (what SRC holds), `convert` (images converted
in processes), `journal` (resuming an interrupted pack), `open_shard` (a shard written under a
temporary name), `pack_errors`; their names are importable from here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.data.convert import convert, convert_all, pool_size  # noqa: F401 - old home
from gpufeed.data.destination import Destination
from gpufeed.data.index_file import INDEX_NAME, Index
from gpufeed.data.journal import (  # noqa: F401 - old home
    PACK_FILES,
    STATE_NAME,
    Journal,
    drop_journal,
    load_journal,
    record_name,
    refuse_foreign_shards,
    save_record,
)
from gpufeed.data.listing import IMAGE_SUFFIXES, Item, list_inputs  # noqa: F401 - old home
from gpufeed.data.location import base_url, is_remote
from gpufeed.data.open_shard import OpenShard, signals_deferred, sigterm_exits
from gpufeed.data.pack_errors import NothingPacked, OtherPackError, PackError
from gpufeed.data.shards import ShardError
from gpufeed.progress import reporting
from gpufeed.text import count, visible

# the names tests and older callers use here
_run, _sigterm_exits, _signals_deferred = convert_all, sigterm_exits, signals_deferred

SKIPPED_NAME = "pack-skipped.txt"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*((?:[kmgt]i?)?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


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


def printable(name: str) -> str:
    """`name` as a message shows it (`gpufeed.text.visible`): the bytes of a file name that is not
    UTF-8 (which Python holds as lone surrogates) written as `\\xNN`, control, bidi and zero-width
    characters as escapes."""
    return visible(name)


def _signatures(items: list[Item], classes: list[str], options: dict[str, Any]) -> tuple[str, str]:
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
        with sigterm_exits():
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
    items: list[Item],
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
    journal = load_journal(out, sigs)
    owned = journal is not None or out.exists(INDEX_NAME)  # shards in DST are a pack's
    if not owned:
        refuse_foreign_shards(out)
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
    out.remove_stale_tmp(PACK_FILES)
    journal = journal or Journal()
    entries, consumed = journal.entries, journal.consumed
    result.converted = journal.converted
    result.skipped = listing_skipped + journal.skipped
    result.resumed_shards = len(entries)

    writer: OpenShard | None = None
    skipped: list[tuple[str, str]] = []  # since the last finished shard
    converted: list[tuple[str, str]] = []
    try:
        with reporting(progress, len(items), "packing", unit="images", done=consumed) as advance:
            work = convert_all(items[consumed:], resize, quality, verify, workers)
            for n, (item, status, data, reason) in enumerate(work, start=consumed + 1):
                advance()
                if status == "skipped":
                    skipped.append((item.path, reason))
                    continue
                if status == "converted":
                    converted.append((item.path, reason))
                if writer is None:
                    with signals_deferred():  # the temporary file is `writer`'s before a stop
                        writer = OpenShard(out, len(entries))
                writer.writer.add(item.key, data, "jpg", item.label)
                if writer.writer.size >= target:
                    entries.append(writer.finish())
                    writer = None
                    save_record(out, sig, len(entries) - 1, entries[-1], n, converted, skipped)
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
    drop_journal(out, len(entries))
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
