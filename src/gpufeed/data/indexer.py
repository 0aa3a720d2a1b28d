"""`gpufeed index`: index existing WebDataset tar shards where they lie, so `Loader` reads them.

Each shard is read once, as a stream (local file or S3), recording per sample its key, label,
header and image offsets, and per shard its size and SHA-256: the same index `gpufeed pack`
writes, so the loader gives these shards every guarantee it gives its own (exactly-once,
resumption, corrupt-sample reports, checksum verification). The shard is read by
`gpufeed.data.tar_scan`, the scanner the Loader reads through, with its rules (regular files only,
no escaping names, nothing that could be unpickled, sizes within the shard, tars joined end to
end read whole, no key repeated), so what is indexed is read. Labels come from each sample's
`.cls` (an integer or a class name) or `.json` (its `cls`/`label`/`class` field, or
`label_field`); class names become ids through `classes` (a mapping given) or, without one, in
sorted order. The index is written as `gpufeed-index.json` in the shards' directory, next to the
indexes of other shards there (indexing a train and a val set in one directory keeps both).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from gpufeed.data.destination import Destination
from gpufeed.data.index_file import (
    IMAGE_EXTS,
    INDEX_NAME,
    LEGACY_INDEX_NAME,
    MAX_LABEL,
    Index,
    ShardEntry,
)
from gpufeed.data.location import is_remote
from gpufeed.data.readers import VerifyingReader
from gpufeed.data.shard_urls import (  # noqa: F401 - their old home
    MAX_SHARDS,
    brace_count,
    expand_urls,
    is_shard_pattern,
    split_shards,
)
from gpufeed.data.shards import ShardError
from gpufeed.data.source import Source
from gpufeed.data.tar_scan import BLOCK, BadHeader, Tape, members, samples
from gpufeed.progress import reporting
from gpufeed.text import MB, MiB, count

LABEL_FIELDS = ("cls", "label", "class")


@dataclass
class IndexResult:
    """What `index_shards` wrote: the index's totals, with the shards kept from an index there."""

    index: str  # where the index was written
    shards: int  # in the index: those read now and those kept from before
    samples: int
    classes: int
    bytes: int
    indexed: int = 0  # shards read now
    kept: int = 0  # shards the index there listed, not read again
    dropped: list[str] = field(default_factory=list)  # shards it listed whose files are gone

    def summary(self) -> str:
        totals = (
            f"{count(self.samples, 'sample')} of {count(self.classes, 'class')} in "
            f"{count(self.shards, 'shard')} ({self.bytes / MB:.1f} MB)"
        )
        if self.kept:
            text = (
                f"indexed {count(self.indexed, 'shard')} into {self.index}, which now lists "
                f"{totals}, {self.kept} of them kept from before"
            )
        else:
            text = f"indexed {totals} into {self.index}"
        if self.dropped:
            more = ", ..." if len(self.dropped) > 3 else ""
            text += (
                f"; dropped {count(len(self.dropped), 'shard')} it listed whose file is gone "
                f"({', '.join(self.dropped[:3])}{more})"
            )
        return text


def load_classes(path: str | os.PathLike[str]) -> list[str]:
    """Class names by id from a file: a JSON list, a JSON object {name: id}, or one name a line."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ShardError(f"cannot read classes file {where}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        text = "\x00"  # refused below as binary
    if any(ord(ch) < 32 and ch not in "\t\r\n" for ch in text):
        raise ShardError(
            f"classes file {where} is binary (not UTF-8 text, or control characters): give one "
            "class name a line, a JSON list of names or a JSON object {name: id}"
        )
    if where.endswith(".json"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ShardError(f"classes file {where} is not valid JSON ({e})") from None
        if isinstance(doc, dict):
            ids = sorted(doc.values()) if all(isinstance(v, int) for v in doc.values()) else None
            if ids != list(range(len(doc))):
                raise ShardError(
                    f"classes file {where}: the ids must be the integers 0..{len(doc) - 1}, "
                    "each once"
                )
            return [str(name) for name, _ in sorted(doc.items(), key=lambda kv: kv[1])]
        if not isinstance(doc, list):
            raise ShardError(f"classes file {where}: want a JSON list of names or {{name: id}}")
        names = [str(c) for c in doc]
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise ShardError(f"classes file {where} lists no classes")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise ShardError(f"classes file {where} names the class {twice!r} twice: list each once")
    return names


def _raw_label(key: str, parts: dict[str, bytes], field: str | None, where: str) -> int | str:
    """The label of one sample, as an integer id (at most `MAX_LABEL`) or a class name."""
    label = _label_of(key, parts, field, where)
    if isinstance(label, int) and label > MAX_LABEL:  # the class list would be that long
        shown = label if label < 10**12 else f"{label:.3g}"  # a JSON 1e300 has 301 digits
        raise ShardError(
            f"shard {where}: label {shown} of sample {key!r} is over {MAX_LABEL:,}: numeric "
            "labels are class numbers 0..N-1; fix the label, or write the class name instead"
        )
    return label


def _label_of(key: str, parts: dict[str, bytes], field: str | None, where: str) -> int | str:
    if "cls" in parts:
        text = parts["cls"].decode("utf-8", "replace").strip()
        return int(text) if re.fullmatch(r"-?[0-9]+", text) else text
    if "json" in parts:
        try:
            doc = json.loads(parts["json"])
        except ValueError as e:
            raise ShardError(f"shard {where}: sample {key!r} has invalid .json ({e})") from None
        fields = (field,) if field else LABEL_FIELDS
        value = next((doc[f] for f in fields if f in doc), None) if isinstance(doc, dict) else doc
        if value is None:
            raise ShardError(
                f"shard {where}: sample {key!r} has no label in its .json (looked for "
                f"{', '.join(fields)}); pass label_field (--label-field) naming it"
            )
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 1.0, as some writers store class ids
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
            value = int(value)  # "2", as a .cls file holds it: a class id, not a name
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            return value
        raise ShardError(
            f"shard {where}: label {json.dumps(value)[:60]} in sample {key!r} is not an integer "
            "or a class name"
        )
    raise ShardError(
        f"shard {where}: sample {key!r} has no label (.cls, or .json with a "
        f"{'/'.join(LABEL_FIELDS)} field)"
    )


def _open(url: str, storage_options: dict[str, Any] | None) -> tuple[BinaryIO, int]:
    """A shard opened for one sequential read, and its size; a remote one is read as the Loader
    reads it (`Source`: each request within the deadline, retried, errors naming URL and
    endpoint)."""
    if is_remote(url):
        folder, name = url.rsplit("/", 1)
        size = Destination(folder, storage_options).size(name)
        entry = ShardEntry(name=name, bytes=size)  # no checksum yet: `VerifyingReader` computes it
        return Source(folder, storage_options=storage_options).open(entry), size
    try:
        f = open(url, "rb")  # noqa: SIM115 - handed to the caller
    except FileNotFoundError:
        raise ShardError(f"shard {url} not found") from None
    except (IsADirectoryError, PermissionError) as e:
        raise ShardError(f"cannot read shard {url}: {e.strerror or e}") from None
    return f, os.fstat(f.fileno()).st_size


LABEL_EXTS = ("cls", "json")


def _not_a_tar(url: str, why: str) -> ShardError:
    compressed = url.endswith((".gz", ".tgz", ".bz2", ".xz", ".zst"))
    return ShardError(
        f"shard {url} is not an uncompressed tar file ({why}): "
        + (
            "decompress it first; compressed shards cannot be read at offsets"
            if compressed
            else "a WebDataset shard is a plain .tar of <key>.<ext> members"
        )
    )


def _samples(
    stream: VerifyingReader, size: int, entry: ShardEntry, label_field: str | None, url: str
) -> list[int | str]:
    """Read the shard through `tar_scan` (its rules are the Loader's), recording each sample's
    key, header offset and image into `entry`; returns each sample's raw label."""
    raw: list[int | str] = []
    tape = Tape(url, b"", 0, size, read=stream.read, chunk=8 * MiB)
    for key, start, parts in samples(members(tape, 0, size, end=True, keep=LABEL_EXTS), url):
        # the first image member, its type kept as written (.JPEG): it names the member
        image = next((m for ext, (m, _) in parts.items() if ext in IMAGE_EXTS), None)
        if image is None:
            raise ShardError(
                f"shard {url}: sample {key!r} has no image member "
                f"({', '.join(sorted(IMAGE_EXTS))}); only image data sets can be indexed"
            )
        entry.keys.append(key)  # type: ignore[union-attr]
        entry.offsets.append(start)  # type: ignore[union-attr]
        entry.image_offsets.append(image.data)  # type: ignore[union-attr]
        entry.image_sizes.append(image.size)  # type: ignore[union-attr]
        entry.image_exts.append(image.name.rsplit("/", 1)[-1].partition(".")[2])  # type: ignore[union-attr]
        labels = {ext: data for ext, (_, data) in parts.items() if data is not None}
        raw.append(_raw_label(key, labels, label_field, url))
    return raw


def index_shard(
    url: str,
    name: str,
    *,
    label_field: str | None = None,
    storage_options: dict[str, Any] | None = None,
    seen: Callable[[int], None] = lambda n: None,
) -> tuple[ShardEntry, list[int | str]]:
    """One streaming pass over a WebDataset shard: its index entry and each sample's raw label."""
    entry = ShardEntry(name=name, keys=[], labels=[], offsets=[])
    f, size = _open(url, storage_options)
    unreported = [0]

    def read(
        n: int,
    ) -> None:  # progress every 4 MiB (the scanner reads less at a time) and at the end
        unreported[0] += n
        if unreported[0] >= 4 * MiB:
            seen(unreported[0])
            unreported[0] = 0

    with VerifyingReader(f, entry, url, seen=read) as stream:  # closes `f`
        try:
            if size < BLOCK:
                raise _not_a_tar(url, f"{size} bytes, less than one tar header")
            raw = _samples(stream, size, entry, label_field, url)
            while stream.read(8 * MiB):  # the rest, if it grew: size and checksum as read
                pass
            seen(unreported[0])
        except BadHeader as e:
            if e.at == 0:
                raise _not_a_tar(url, f"invalid header: {e.reason}") from None
            raise
        except OSError as e:
            raise ShardError(f"cannot read shard {url}: {e}") from None
    if not entry.keys:
        raise ShardError(f"shard {url} holds no samples: remove it from the list")
    entry.bytes, entry.sha256 = stream.count, stream.digest
    return entry, raw


def _resolve_labels(
    raws: list[list[int | str]], classes: list[str] | None, where: str
) -> tuple[list[str], list[list[int]]]:
    """(class names, each shard's label ids): names through `classes`, or sorted when not given."""
    flat = [x for r in raws for x in r]
    names = {x for x in flat if isinstance(x, str)}
    if classes is not None:
        ids = {c: i for i, c in enumerate(classes)}
        for r in raws:
            for x in r:
                if (isinstance(x, str) and x not in ids) or (
                    isinstance(x, int) and not 0 <= x < len(classes)
                ):
                    raise ShardError(
                        f"{where}: unknown class {x!r} (not one of the {len(classes)} classes "
                        "given); fix the mapping or the shards"
                    )
        return classes, [[ids[x] if isinstance(x, str) else x for x in r] for r in raws]
    if names and any(isinstance(x, int) for x in flat):
        raise ShardError(
            f"{where}: labels mix integer ids and class names; pass the class list (--classes)"
        )
    if names:
        ordered = sorted(names)
        ids = {c: i for i, c in enumerate(ordered)}
        return ordered, [[ids[x] for x in r] for r in raws]  # type: ignore[index]
    if any(x < 0 for x in flat):  # type: ignore[operator]
        raise ShardError(f"{where}: a label is negative; class ids start at 0")
    top = max(flat, default=-1)
    return [str(i) for i in range(int(top) + 1)], raws  # type: ignore[return-value]


def _old_index(out: Destination) -> Index | None:
    """The index already in the shards' directory (None if none), read before any shard: one
    that cannot be read would otherwise stop the command after all the work."""
    where = out.path(INDEX_NAME)
    try:
        if not out.exists(INDEX_NAME):
            return None
        data = out.read_bytes(INDEX_NAME)
    except OSError as e:  # local (a remote failure is a ShardError already)
        raise ShardError(
            f"cannot read {where}: {e.strerror or e}; make it readable, or delete it (or move it "
            "away) and run `gpufeed index` again"
        ) from None
    try:
        return Index.from_bytes(data, where)
    except ShardError as e:
        reason = str(e).split("; re-create it", 1)[0]
        raise ShardError(
            f"{reason}; delete it (or move it away) and run `gpufeed index` again"
        ) from None


def _check_writable(out: Destination) -> None:
    """Refuse a local directory the index cannot be written into before any shard is read (a
    remote one says so when written: only a write can tell)."""
    if not out.remote and not os.access(out.url, os.W_OK | os.X_OK):
        raise _cannot_write(out, "permission denied")


def _cannot_write(out: Destination, why: str) -> ShardError:
    return ShardError(
        f"cannot write {out.path(INDEX_NAME)}: {why}; the index lives next to the shards: make "
        f"{out.url} writable, or copy the shards to a writable folder and index them there"
    )


def _gone(out: Destination, names: list[str]) -> set[str]:
    """Which of the shards `names` are no longer in `out` (one listing when remote)."""
    if not names:
        return set()
    if not out.remote:
        return {n for n in names if not os.path.isfile(out.path(n))}
    here = out.sizes()
    return {n for n in names if n not in here and ("/" not in n or not out.exists(n))}


def _merge(
    out: Destination, old: Index | None, classes: list[str], entries: list[ShardEntry]
) -> tuple[Index, int, list[str]]:
    """(the index, how many shards it keeps from `old`, the names of those dropped): the new
    entries, plus those of other shards `old` lists that are still there, sorted by name as a
    fresh index of them all would be. Integer labels named by their numbers take the names
    `old` gives them (a `gpufeed pack` folder indexed again keeps its class names)."""
    if old is None:
        return Index(classes, entries), 0, []
    if classes == [str(i) for i in range(len(classes))] and len(old.classes) >= len(classes):
        classes = list(old.classes)
    mine = {e.name for e in entries}
    others = [e for e in old.shards if e.name not in mine]
    gone = _gone(out, [e.name for e in others])
    kept = [e for e in others if e.name not in gone]
    dropped = [e.name for e in others if e.name in gone]
    if not kept:
        return Index(classes, entries), 0, dropped
    short, long = sorted((old.classes, classes), key=len)
    if long[: len(short)] != short:
        raise ShardError(
            f"{out.path(INDEX_NAME)} already indexes other shards ({kept[0].name}, ...) with "
            "other classes: index all shards of this directory in one command, or give the "
            "same class list (--classes)"
        )
    shards = sorted(kept + entries, key=lambda e: e.name)
    return Index(list(long), shards), len(kept), dropped


def index_shards(
    shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    classes: str | os.PathLike[str] | Sequence[str] | None = None,
    label_field: str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> IndexResult:
    """Index existing WebDataset shards (paths, s3:// URLs or prefixes, brace patterns) into
    `gpufeed-index.json` in their directory; `classes` maps class names to ids (a file or list).
    Entries of other shards an index there lists are kept while their files are there."""
    urls = expand_urls(shards, must_exist=True, storage_options=storage_options)
    base, names = split_shards(urls)
    if isinstance(classes, (str, os.PathLike)):
        classes = load_classes(classes)
    elif classes is not None:
        classes = [str(c) for c in classes]
    if not is_remote(base) and not os.path.isdir(base):  # Destination would create it
        raise ShardError(f"shard {base}/{names[0]} not found: there is no folder {base}")
    out = Destination(base, storage_options)
    for name in (INDEX_NAME, LEGACY_INDEX_NAME):
        if name in names:
            raise ShardError(f"{out.path(name)} is an index, not a shard")
    _check_writable(out)
    old = _old_index(out)
    total = sum(_size(out, n) for n in names) if progress else 0
    entries, raws = [], []
    with reporting(progress, total, f"indexing {count(len(names), 'shard')}", unit="bytes") as seen:
        for name in names:
            entry, raw = index_shard(
                out.path(name), name, label_field=label_field,
                storage_options=storage_options, seen=seen,
            )  # fmt: skip
            entries.append(entry)
            raws.append(raw)
    names_, labels = _resolve_labels(raws, classes, base)
    for entry, lab in zip(entries, labels, strict=True):
        entry.labels = lab
    index, kept, dropped = _merge(out, old, names_, entries)
    try:
        out.write_bytes(INDEX_NAME, index.to_bytes())
    except OSError as e:  # local (a remote failure is a ShardError already)
        raise _cannot_write(out, e.strerror or str(e)) from None
    return IndexResult(
        index=out.path(INDEX_NAME),
        shards=len(index.shards),
        samples=sum(e.samples for e in index.shards),
        classes=len(index.classes),
        bytes=sum(e.bytes for e in index.shards),
        indexed=len(entries),
        kept=kept,
        dropped=dropped,
    )


def _size(out: Destination, name: str) -> int:
    try:
        return out.size(name)
    except FileNotFoundError:
        raise ShardError(f"shard {out.path(name)} not found") from None
