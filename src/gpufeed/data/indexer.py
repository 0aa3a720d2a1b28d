"""`gpufeed index`: index existing WebDataset tar shards where they lie, so `Loader` reads them.

Each shard is read once, as a stream (local file or S3), recording per sample its key, label,
header and image offsets, and per shard its size and SHA-256: the same index `gpufeed pack`
writes, so the loader gives these shards every guarantee it gives its own (exactly-once,
resumption, corrupt-sample reports, checksum verification). Members are checked as on every read
(no links, no escaping names, nothing that could be unpickled). Labels come from each sample's
`.cls` (an integer or a class name) or `.json` (its `cls`/`label`/`class` field, or
`label_field`); class names become ids through `classes` (a mapping given) or, without one, in
sorted order. The index is written as `gpufeed-index.json` in the shards' directory, next to the
indexes of other shards there (indexing a train and a val set in one directory keeps both).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gpufeed.data.shards import (
    IMAGE_EXTS,
    INDEX_NAME,
    LEGACY_INDEX_NAME,
    Index,
    ShardEntry,
    ShardError,
    _check_member,
    _check_regular_header,
    _ext,
    _harmless_pax,
    _padded,
    _regular_header,
    check_shard_name,
    split_name,
)
from gpufeed.data.source import MB, Destination, filesystem, is_remote
from gpufeed.present.numbers import count

LABEL_FIELDS = ("cls", "label", "class")


@dataclass
class IndexResult:
    """What `index_shards` wrote."""

    index: str  # where the index was written
    shards: int
    samples: int
    classes: int
    bytes: int

    def summary(self) -> str:
        return (
            f"indexed {count(self.samples, 'sample')} of {count(self.classes, 'class')} in "
            f"{count(self.shards, 'shard')} "
            f"({self.bytes / 1e6:.1f} MB) into {self.index}"
        )


MAX_SHARDS = 1_000_000  # names one list of shard URLs may hold (more is a typo'd range)


def expand_urls(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, must_exist: bool = False
) -> list[str]:
    """Shard URLs or paths with brace ranges expanded (`shards-{000000..000099}.tar`), in order;
    a local directory stands for the .tar files in it. Patterns naming more than MAX_SHARDS
    shards are refused before anything is expanded; with `must_exist`, the first local shard
    that is not there is a ShardError at once."""
    from braceexpand import braceexpand

    items = [str(u) for u in ([urls] if isinstance(urls, (str, os.PathLike)) else list(urls))]
    try:
        total = sum(brace_count(item) for item in items)
    except ValueError as e:
        raise ShardError(f"bad brace pattern: {e}; write ranges as name-{{000..099}}.tar") from None
    if total > MAX_SHARDS:
        raise ShardError(
            f"{' '.join(items)} names {total:,} shards, more than the {MAX_SHARDS:,} gpufeed "
            "takes at once: check the brace range (one digit too many?), or index the shards "
            "in parts"
        )
    out: list[str] = []
    for item in items:
        for u in braceexpand(item):
            if not is_remote(u) and os.path.isdir(u):  # a local directory: its .tar files
                found = sorted(str(p) for p in Path(u).glob("*.tar"))
                if not found:
                    raise ShardError(f"{u} is a directory without .tar files: name the shards")
                out += found
            elif must_exist and not is_remote(u) and not os.path.exists(u):
                folder = os.path.dirname(u) or "."
                where = "" if os.path.isdir(folder) else f": there is no folder {folder}"
                raise ShardError(f"shard {u} not found{where}")
            else:
                out.append(u)
            if len(out) > MAX_SHARDS:
                raise ShardError(
                    f"{item} names more than {MAX_SHARDS:,} shards (with the .tar files of "
                    "its directories): index the shards in parts"
                )
    return out


def brace_count(pattern: str) -> int:
    """How many names `braceexpand(pattern)` yields, counted without expanding them (braceexpand
    holds every name of a range in memory); a ValueError for unbalanced braces."""
    from braceexpand import alphabet, char_range_re, int_range_re

    def expression(expr: str) -> int:
        m = int_range_re.match(expr)
        if m:
            first, last, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1) or 1
            if first < last:
                return len(range(first, last + 1, step))
            return len(range(first, last - 1, -step))
        m = char_range_re.match(expr)
        if m:
            first, last = alphabet.index(m.group(1)), alphabet.index(m.group(2))
            step = int(m.group(3) or 1) or 1
            if first < last:
                return len(alphabet[first : last + 1 : step])
            return len(alphabet[first : (last or -len(alphabet)) - 1 : -step])
        parts = sequence(expr)
        return pattern_(expr) if parts is None else sum(pattern_(p) for p in parts)

    def sequence(seq: str) -> list[str] | None:  # the comma-separated parts; None if no comma
        parts, start, pos, depth = [], 0, 0, 0
        while pos < len(seq):
            if seq[pos] == "\\":
                pos += 2
                continue
            if seq[pos] == "{":
                depth += 1
            elif seq[pos] == "}":
                depth -= 1
            elif seq[pos] == "," and depth == 0:
                parts.append(seq[start:pos])
                start = pos + 1
            pos += 1
        if depth != 0 or not parts:
            return None
        return [*parts, seq[start:]]

    def pattern_(text: str) -> int:
        n, start, pos, depth = 1, 0, 0, 0
        while pos < len(text):
            if text[pos] == "\\":
                pos += 2
                continue
            if text[pos] == "{":
                if depth == 0:
                    start = pos
                depth += 1
            elif text[pos] == "}":
                depth -= 1
                if depth == 0:
                    n *= expression(text[start + 1 : pos])
            pos += 1
        if depth != 0:
            raise ValueError(f"Unbalanced braces: '{text}'")
        return n

    return pattern_(pattern)


def is_shard_pattern(url: str | os.PathLike[str]) -> bool:
    """True for a brace pattern or a path ending in .tar (shards named one by one, not a directory)."""
    return "{" in str(url) or str(url).rstrip("/").endswith(".tar")


def split_shards(urls: Sequence[str]) -> tuple[str, list[str]]:
    """(the directory holding every shard, their names relative to it); the index lives there."""
    if not urls:
        raise ShardError("no shards given: name them, e.g. 'shards-{000000..000099}.tar'")
    remote = {is_remote(u) for u in urls}
    if len(remote) > 1:
        raise ShardError("shards are partly local, partly remote: give them in one place")
    norm = list(urls) if remote == {True} else [os.path.abspath(u) for u in urls]
    base = posixpath.dirname(norm[0])
    while any(not u.startswith(base + "/") for u in norm):
        parent = posixpath.dirname(base)
        if parent == base or base.endswith("://") or "/" not in base.split("://")[-1]:
            raise ShardError(f"shards {urls[0]} and others share no directory to index them in")
        base = parent
    names = [u[len(base) + 1 :] for u in norm]
    for name in names:
        check_shard_name(name)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ShardError(f"shard {base}/{dup} is named twice")
    return base, names


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


class _Hashing:
    """A read-only stream that hashes and counts every byte read through it."""

    def __init__(self, f: BinaryIO, seen: Callable[[int], None]) -> None:
        self.f, self.seen, self.sha, self.count, self.reported = f, seen, hashlib.sha256(), 0, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        self.count += len(data)
        if self.count - self.reported >= 4 * MB or not data:  # tarfile reads 10 KB at a time
            self.seen(self.count - self.reported)
            self.reported = self.count
        return data


def _raw_label(key: str, parts: dict[str, bytes], field: str | None, where: str) -> int | str:
    """The label of one sample, as an integer id or a class name."""
    if "cls" in parts:
        text = parts["cls"].decode("utf-8", "replace").strip()
        return int(text) if text.lstrip("-").isdigit() else text
    if "json" in parts:
        try:
            doc = json.loads(parts["json"])
        except ValueError as e:
            raise ShardError(f"shard {where}: sample {key!r} has invalid .json ({e})") from None
        fields = (field,) if field else LABEL_FIELDS
        value = next((doc[f] for f in fields if f in doc), None) if isinstance(doc, dict) else doc
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            return value
        raise ShardError(
            f"shard {where}: sample {key!r} has no label in its .json (looked for "
            f"{', '.join(fields)}); pass label_field (--label-field) naming it"
        )
    raise ShardError(
        f"shard {where}: sample {key!r} has no label (.cls, or .json with a "
        f"{'/'.join(LABEL_FIELDS)} field)"
    )


def _open(url: str, storage_options: dict[str, Any] | None) -> BinaryIO:
    try:
        if is_remote(url):
            return filesystem(url, storage_options).open(url, "rb", block_size=8 * MB)
        return open(url, "rb")
    except FileNotFoundError:
        raise ShardError(f"shard {url} not found") from None
    except (IsADirectoryError, PermissionError) as e:
        raise ShardError(f"cannot read shard {url}: {e.strerror or e}") from None


# (offset of the member's first header, offset of its data, name, size, data if a label member)
Member = tuple[int, int, str, int, bytes | None]
LABEL_EXTS = ("cls", "json")


class _NotPlain(Exception):
    """The fast scanner met a header it does not read itself: tarfile reads the shard instead."""


def _plain_members(stream: _Hashing, url: str) -> Iterator[Member]:
    """The members of a tar of plain regular-file headers (and pax headers that only set times or
    owners, as webdataset writes), parsed from big reads; `_NotPlain` for anything else."""
    buf, start, at = b"", 0, 0  # buf holds the shard's bytes from offset `start`; `at`: cursor

    def need(n: int) -> bytes:
        nonlocal buf, start
        while at + n > start + len(buf):
            chunk = stream.read(8 * MB)
            if not chunk:
                raise _NotPlain  # truncated: tarfile names the problem
            buf, start = buf[at - start :] + chunk, at
        return buf[at - start : at - start + n]

    first = None  # where the current member's headers began (a pax header comes first)
    while True:
        header = need(512)
        if not header.strip(b"\0"):
            return  # end-of-archive (the rest is read by the caller, for size and checksum)
        pax = _regular_header(header, types=(0x78,))
        if pax is not None:
            block = need(512 + _padded(pax[1]))
            if _harmless_pax(block, 0) is None:
                raise _NotPlain
            first = at if first is None else first
            at += len(block)
            continue
        plain = _check_regular_header(header, url)
        if plain is None:
            raise _NotPlain
        name, size = plain
        data = need(512 + size)[512:] if _ext(name) in LABEL_EXTS else None
        if data is None:
            need(512 + _padded(size))  # read through (hashed), not kept
        yield (at if first is None else first), at + 512, name, size, data
        at += 512 + _padded(size)
        first = None


def _tar_members(stream: _Hashing, url: str) -> Iterator[Member]:
    """The members of any tar, read by tarfile (extension headers of every kind)."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
        for info in tar:
            _check_member(info, url)
            if info.isdir():  # GNU tar's folder entries: no sample
                continue
            data = None
            if split_name(info.name)[1] in LABEL_EXTS:
                member = tar.extractfile(info)
                data = member.read() if member is not None else b""
            yield info.offset, info.offset_data, info.name, info.size, data


def _samples(
    members: Iterator[Member], entry: ShardEntry, label_field: str | None, url: str
) -> list[int | str]:
    """Group members into samples by key (as WebDataset does), recording each into `entry`;
    returns each sample's raw label."""
    raw: list[int | str] = []
    key: str | None = None
    parts: dict[str, bytes] = {}
    image: tuple[int, int, str] | None = None

    def finish() -> None:
        if key is None:
            return
        if image is None:
            raise ShardError(
                f"shard {url}: sample {key!r} has no image member "
                f"({', '.join(sorted(IMAGE_EXTS))}); only image data sets can be indexed"
            )
        entry.image_offsets.append(image[0])  # type: ignore[union-attr]
        entry.image_sizes.append(image[1])  # type: ignore[union-attr]
        entry.image_exts.append(image[2])  # type: ignore[union-attr]
        raw.append(_raw_label(key, parts, label_field, url))

    for offset, data_offset, name, size, data in members:
        k, ext = split_name(name)
        if k != key:
            finish()
            key, parts, image = k, {}, None
            entry.keys.append(k)  # type: ignore[union-attr]
            entry.offsets.append(offset)  # type: ignore[union-attr]
        if ext in IMAGE_EXTS and image is None:  # kept as written (.JPEG): it names the member
            image = (data_offset, size, name.rsplit("/", 1)[-1].partition(".")[2])
        elif data is not None:
            parts[ext] = data
    finish()
    return raw


def index_shard(
    url: str,
    name: str,
    *,
    label_field: str | None = None,
    storage_options: dict[str, Any] | None = None,
    seen: Callable[[int], None] = lambda n: None,
) -> tuple[ShardEntry, list[int | str]]:
    """One streaming pass over a WebDataset shard: its index entry and each sample's raw label.
    Plain shards are parsed by a fast scanner; any other (long names, ...) again by tarfile."""
    for reader in (_plain_members, _tar_members):
        entry = ShardEntry(name=name, keys=[], labels=[], offsets=[])
        with _open(url, storage_options) as f:
            stream = _Hashing(f, seen)
            try:
                raw = _samples(reader(stream, url), entry, label_field, url)
                while stream.read(8 * MB):  # the rest (end-of-archive padding): size, checksum
                    pass
            except _NotPlain:
                continue
            except OSError as e:
                raise ShardError(f"cannot read shard {url}: {e}") from None
            except (tarfile.TarError, EOFError) as e:
                compressed = url.endswith((".gz", ".tgz", ".bz2", ".xz", ".zst"))
                raise ShardError(
                    f"shard {url} is not an uncompressed tar file ({e}): "
                    + (
                        "decompress it first; compressed shards cannot be read at offsets"
                        if compressed
                        else "a WebDataset shard is a plain .tar of <key>.<ext> members"
                    )
                ) from None
        break
    if not entry.keys:
        raise ShardError(f"shard {url} holds no samples: remove it from the list")
    entry.bytes, entry.sha256 = stream.count, stream.sha.hexdigest()
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


def _merge(out: Destination, classes: list[str], entries: list[ShardEntry]) -> Index:
    """The new entries, plus those of other shards already indexed in the same directory.
    Integer labels named by their numbers take the names the index there gives them (a
    `gpufeed pack` folder indexed again keeps its class names)."""
    if not out.exists(INDEX_NAME):
        return Index(classes, entries)
    old = Index.from_bytes(out.read_bytes(INDEX_NAME), out.path(INDEX_NAME))
    if classes == [str(i) for i in range(len(classes))] and len(old.classes) >= len(classes):
        classes = list(old.classes)
    mine = {e.name for e in entries}
    kept = [e for e in old.shards if e.name not in mine]
    if not kept:
        return Index(classes, entries)
    short, long = sorted((old.classes, classes), key=len)
    if long[: len(short)] != short:
        raise ShardError(
            f"{out.path(INDEX_NAME)} already indexes other shards ({kept[0].name}, ...) with "
            "other classes: index all shards of this directory in one command, or give the "
            "same class list (--classes)"
        )
    return Index(list(long), kept + entries)


def index_shards(
    shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    classes: str | os.PathLike[str] | Sequence[str] | None = None,
    label_field: str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> IndexResult:
    """Index existing WebDataset shards (paths, s3:// URLs, brace patterns) into
    `gpufeed-index.json` in their directory; `classes` maps class names to ids (a file or list)."""
    urls = expand_urls(shards, must_exist=True)
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
    total = sum(_size(out, n) for n in names) if progress else 0
    entries, raws = [], []
    with _bytes_progress(progress, total, f"indexing {count(len(names), 'shard')}") as seen:
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
    index = _merge(out, names_, entries)
    out.write_bytes(INDEX_NAME, index.to_bytes())
    return IndexResult(
        index=out.path(INDEX_NAME),
        shards=len(entries),
        samples=sum(e.samples for e in entries),
        classes=len(index.classes),
        bytes=sum(e.bytes for e in entries),
    )


def _size(out: Destination, name: str) -> int:
    try:
        return out.size(name)
    except FileNotFoundError:
        raise ShardError(f"shard {out.path(name)} not found") from None


class _bytes_progress:
    """A rich progress bar over bytes read (or nothing): `with _bytes_progress(...) as seen:`."""

    def __init__(self, enabled: bool, total: int, what: str) -> None:
        self.enabled, self.total, self.what = enabled, total, what

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            transient=True,
            console=Console(stderr=True),  # stdout keeps only the summary, e.g. for a file
        )
        self.bar.__enter__()
        task = self.bar.add_task(self.what, total=self.total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)
