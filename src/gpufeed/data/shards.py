"""The shard format: tar files in WebDataset layout (`<key>.jpg`, `<key>.cls`) plus an index,
`gpufeed-index.json` (`index.json` in data sets packed before; still read).

Writing is deterministic (fixed mtime/owner) so a re-pack gives identical bytes. Reading goes
straight to the image offsets recorded in the index (`read_indexed`), checking the tar header in
front of each image and the headers of the members between the images it reads; shards without
offsets are parsed member by member (`iter_samples`). Either way every member read is validated: no
links, no names that escape a directory, and no member type that could be unpickled (see
`FORBIDDEN_EXTS`), so shards are safe to read from untrusted storage. Only the extensions in
`IMAGE_EXTS`/`META_EXTS` are interpreted; other unknown members are ignored.

The index is validated when it is parsed (`Index.from_bytes`): its shape, shard names (relative,
inside the data set, no NUL or control characters), checksums (64 hex digits, or empty for none)
and offsets (inside the shard). What it promises is checked on read: `Source` checks each shard's
size and, whenever a shard is read from start to end, its SHA-256 (see `gpufeed.data.source`).
The index has no per-sample checksums, so bytes altered inside one image are only found by that
whole-shard check (or, if the image no longer decodes, as a corrupt sample).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import re
import tarfile
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, BinaryIO, ClassVar

import numpy as np

from gpufeed.errors import GpufeedError

INDEX_NAME = "gpufeed-index.json"
# written by gpufeed before 0.2 (and the name MosaicML Streaming and litdata use): still read
LEGACY_INDEX_NAME = "index.json"
INDEX_VERSION = 2
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp"})
META_EXTS = frozenset({"cls", "json", "txt"})
MAX_LABEL = 1_000_000  # a numeric label above this is a mistake, not a class number
# Members that could carry pickled Python objects: a shard holding one is rejected outright.
FORBIDDEN_EXTS = frozenset({"pyd", "pickle", "pkl", "pth", "pt", "ckpt", "joblib", "npy", "npz"})
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# numpy dtypes an index column may be stored as (little-endian, fixed size: never objects)
_COLUMN_DTYPES = frozenset({"|u1", "<u2", "<u4", "<u8", "<i2", "<i4", "<i8"})


class ShardError(GpufeedError):
    """A shard or index is missing, truncated or malformed; the message names it."""


def has_index(directory: str | os.PathLike[str]) -> bool:
    """True if a local directory holds a gpufeed index (either name)."""
    return any(os.path.isfile(os.path.join(directory, n)) for n in (INDEX_NAME, LEGACY_INDEX_NAME))


def shard_name(number: int) -> str:
    """File name of shard `number`."""
    return f"shard-{number:05d}.tar"


class Keys(Sequence[str]):
    """A shard's sample keys held zlib-compressed (their UTF-8 lengths, then the bytes), unpacked
    on use for a few shards at a time: an ImageNet-size index keeps ~6 MB of keys instead of a
    million str objects (hundreds of MB in every process)."""

    _open: ClassVar[deque[Keys]] = deque()  # the instances holding unpacked keys, newest last
    OPEN_MAX: ClassVar[int] = 4

    def __init__(self, packed: bytes | memoryview, n: int) -> None:
        self.packed, self.n = packed, n
        self._unpacked: tuple[bytes, np.ndarray] | None = None

    @classmethod
    def of(cls, keys: Sequence[str]) -> Keys:
        if isinstance(keys, Keys):
            return keys
        raw = [k.encode("utf-8", "surrogateescape") for k in keys]
        if any(len(r) > 0xFFFF for r in raw):
            raise ValueError("a sample key is longer than 65535 bytes")
        lengths = np.array([len(r) for r in raw], dtype="<u2").tobytes()
        return cls(zlib.compress(lengths + b"".join(raw), 6), len(raw))

    def _keys(self) -> tuple[bytes, np.ndarray]:
        if self._unpacked is None:
            try:
                raw = zlib.decompress(self.packed)
            except zlib.error as e:
                raise ShardError(f"the index's keys are corrupt ({e}); re-create it") from None
            lengths = np.frombuffer(raw[: 2 * self.n], dtype="<u2")
            bounds = np.zeros(self.n + 1, np.int64)
            np.cumsum(lengths, out=bounds[1:])
            if len(lengths) != self.n or int(bounds[-1]) != len(raw) - 2 * self.n:
                raise ShardError("the index's keys do not match its sample count; re-create it")
            self._unpacked = (raw[2 * self.n :], bounds)
            Keys._open.append(self)
            while len(Keys._open) > Keys.OPEN_MAX:
                Keys._open.popleft()._unpacked = None
        return self._unpacked

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        blob, bounds = self._keys()
        return blob[int(bounds[i]) : int(bounds[i + 1])].decode("utf-8", "surrogateescape")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


@dataclass
class ShardEntry:
    """One shard as recorded in the index: per-sample keys, labels and byte offsets.

    The per-sample columns are lists while a shard is written and numpy arrays (views into the
    index's columns) once an index is parsed; read single values with `int(...)`.
    """

    name: str
    bytes: int = 0
    sha256: str = ""
    keys: Sequence[str] = field(default_factory=list)
    labels: Sequence[int] = field(default_factory=list)
    offsets: Sequence[int] = field(default_factory=list)  # start of each sample's first header
    image_offsets: Sequence[int] = field(default_factory=list)  # start of each image's bytes
    image_sizes: Sequence[int] = field(default_factory=list)
    image_exts: Sequence[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return len(self.keys)

    @property
    def indexed(self) -> bool:
        """True when the index records every image's offset, size and type (`read_indexed` works)."""
        n = self.samples
        return len(self.image_offsets) == len(self.image_sizes) == len(self.image_exts) == n

    def to_json(self) -> dict[str, Any]:
        """As plain JSON lists (the pack's resume state; the index itself is stored by columns)."""
        return {
            "name": self.name,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "keys": list(self.keys),
            "labels": [int(x) for x in self.labels],
            "offsets": [int(x) for x in self.offsets],
            "image_offsets": [int(x) for x in self.image_offsets],
            "image_sizes": [int(x) for x in self.image_sizes],
            "image_exts": list(self.image_exts),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardEntry:
        """One shard as `to_json` writes it (and version-1 indexes hold it); raises ValueError
        (or ShardError for a name) when malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"a shard entry is {type(d).__name__}, not an object")
        entry = _entry_head(d)
        entry.keys = [str(k) for k in d["keys"]]
        entry.labels = [int(x) for x in d["labels"]]
        entry.offsets = [int(x) for x in d["offsets"]]
        entry.image_offsets = [int(x) for x in d.get("image_offsets", [])]
        entry.image_sizes = [int(x) for x in d.get("image_sizes", [])]
        entry.image_exts = [str(x) for x in d.get("image_exts", [])]
        n = entry.samples
        if not (len(entry.labels) == len(entry.offsets) == n) or int(d.get("samples", n)) != n:
            raise ValueError(f"shard {entry.name}: keys/labels/offsets lengths differ")
        for what in ("offsets", "image_offsets", "image_sizes"):
            values = getattr(entry, what)
            if values and (min(values) < 0 or max(values) > entry.bytes):
                raise ValueError(
                    f"shard {entry.name}: {what} outside the shard's {entry.bytes} bytes"
                )
        return entry


def _entry_head(d: dict[str, Any]) -> ShardEntry:
    """A ShardEntry with the name, size and checksum of shard object `d`, checked."""
    name = d["name"]
    if not isinstance(name, str):
        raise ValueError(f"shard name {name!r} is not a string")
    check_shard_name(name)
    sha = str(d.get("sha256") or "").lower()
    if sha and not SHA256_HEX.fullmatch(sha):
        raise ValueError(f"shard {name}: sha256 {sha[:80]!r} is not 64 hex digits")
    entry = ShardEntry(name=name, bytes=int(d["bytes"]), sha256=sha)
    if entry.bytes < 0:
        raise ValueError(f"shard {entry.name}: bytes is {entry.bytes}")
    return entry


@dataclass
class Index:
    """The contents of the index: class names and the shards in order.

    Stored (version 2) as JSON whose per-sample data are a few base64 numpy columns in the
    smallest dtype that holds them, so an ImageNet-size index parses in well under a second into
    about 40 MB of arrays that forked workers share; version-1 indexes (per-shard JSON lists,
    `index.json`) are still read.
    """

    classes: list[str]
    shards: list[ShardEntry]

    @property
    def total(self) -> int:
        return sum(s.samples for s in self.shards)

    def select(self, names: Sequence[str], where: str) -> Index:
        """The index of just the shards `names`, in that order; a ShardError names any missing."""
        by_name = {s.name: s for s in self.shards}
        missing = [n for n in names if n not in by_name]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ShardError(
                f"shard {missing[0]}{more} is not in {where}: index it first with "
                "`gpufeed index SHARDS...`"
            )
        return Index(self.classes, [by_name[n] for n in names])

    def to_bytes(self, version: int = INDEX_VERSION) -> bytes:
        """The index as stored; `version=1` gives the legacy per-shard lists (for tools and
        tests that edit an index as plain JSON)."""
        if version == 1:
            doc1 = {
                "format": "gpufeed-shards",
                "version": 1,
                "classes": self.classes,
                "total": self.total,
                "shards": [s.to_json() for s in self.shards],
            }
            return json.dumps(doc1, separators=(",", ":")).encode()
        exts = sorted({str(e) for s in self.shards for e in s.image_exts}) or ["jpg"]
        code = {e: i for i, e in enumerate(exts)}
        packed = [Keys.of(s.keys).packed for s in self.shards]

        def image_column(what: str) -> np.ndarray:  # zeros for shards read member by member
            return _concat(getattr(s, what) if s.indexed else [0] * s.samples for s in self.shards)

        columns = {
            "labels": _concat(s.labels for s in self.shards),
            "offsets": _concat(s.offsets for s in self.shards),
            "image_offsets": image_column("image_offsets"),
            "image_sizes": image_column("image_sizes"),
            "image_exts": np.array(
                [
                    code[str(e)] if s.indexed else 0
                    for s in self.shards
                    for e in (s.image_exts if s.indexed else [""] * s.samples)
                ],
                dtype=np.uint8,
            ),
            "keys": np.frombuffer(b"".join(packed), np.uint8),
        }
        doc = {
            "format": "gpufeed-shards",
            "version": INDEX_VERSION,
            "classes": self.classes,
            "total": self.total,
            "exts": exts,
            "shards": [
                {
                    "name": s.name,
                    "samples": s.samples,
                    "indexed": s.indexed,
                    "bytes": s.bytes,
                    "sha256": s.sha256,
                    "keys_size": len(p),
                }
                for s, p in zip(self.shards, packed, strict=True)
            ],
            "columns": {k: _encode_column(v) for k, v in columns.items()},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Index:
        """Parse an index (version 1 or 2); `where` names it in errors."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != "gpufeed-shards":
                raise ValueError("not a gpufeed index (missing format: gpufeed-shards)")
            version = int(doc.get("version", 0))
            if version > INDEX_VERSION:
                raise ValueError(f"index version {doc['version']} is newer than this gpufeed")
            for field_ in ("classes", "shards"):
                if not isinstance(doc[field_], list):
                    raise ValueError(f"{field_!r} is not a list")
            classes = [str(c) for c in doc["classes"]]
            if version < 2:  # into columns, so a legacy index costs no more once loaded
                legacy = cls(classes, [ShardEntry.from_json(s) for s in doc["shards"]])
                del doc
                doc = json.loads(legacy.to_bytes())
            return cls(classes, _columns_to_shards(doc))
        except KeyError as e:
            raise ShardError(
                f"{where}: invalid index: missing {e}; re-create it with `gpufeed pack` "
                "(or `gpufeed index`)"
            ) from e
        except (
            ValueError,
            TypeError,
            AttributeError,
            OverflowError,
            RecursionError,
            ShardError,
            binascii.Error,
        ) as e:
            raise ShardError(
                f"{where}: invalid index: {e}; re-create it with `gpufeed pack` "
                "(or `gpufeed index`)"
            ) from e


def _concat(parts: Iterable[Sequence[int]]) -> np.ndarray:
    arrays = [np.asarray(p, dtype=np.int64) for p in parts]
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)


def _encode_column(values: np.ndarray) -> dict[str, str]:
    """A column as {dtype, base64 data}, in the smallest listed dtype that holds its values."""
    values = np.asarray(values)
    lo, hi = (int(values.min()), int(values.max())) if values.size else (0, 0)
    if values.dtype == np.uint8:
        dtype = "|u1"
    elif lo >= 0:
        dtype = next(t for t in ("|u1", "<u2", "<u4", "<i8") if hi <= np.iinfo(t).max)
    else:
        dtype = next(
            t for t in ("<i2", "<i4", "<i8") if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max
        )
    return {"dtype": dtype, "data": base64.b64encode(values.astype(dtype).tobytes()).decode()}


def _decode_column(doc: dict[str, Any], name: str, length: int) -> np.ndarray:
    col = doc["columns"][name]
    if not isinstance(col, dict) or col.get("dtype") not in _COLUMN_DTYPES:
        raise ValueError(f"column {name!r} has no supported dtype")
    raw = base64.b64decode(col["data"], validate=True)
    dtype = np.dtype(col["dtype"])
    if len(raw) != length * dtype.itemsize:
        raise ValueError(f"column {name!r} holds {len(raw)} bytes, expected {length} values")
    return np.frombuffer(raw, dtype=dtype)


def _columns_to_shards(doc: dict[str, Any]) -> list[ShardEntry]:
    """Version 2: the shards, their per-sample columns as views into the index's arrays."""
    heads = doc["shards"]
    entries = []
    for h in heads:
        if not isinstance(h, dict):
            raise ValueError(f"a shard entry is {type(h).__name__}, not an object")
        entries.append(_entry_head(h))
    counts = np.array([int(h["samples"]) for h in heads], dtype=np.int64)
    if (counts < 0).any():
        raise ValueError("a shard has a negative sample count")
    total = int(counts.sum())
    if int(doc.get("total", total)) != total:
        raise ValueError(f"total {doc['total']} is not the sum of the shards' samples ({total})")
    exts = [str(e) for e in doc["exts"]]
    if bad := [e for e in exts if e.lower() not in IMAGE_EXTS]:  # as written: .JPEG too
        raise ValueError(f"image type {bad[0][:20]!r} is not one of {sorted(IMAGE_EXTS)}")
    cols = {
        name: _decode_column(doc, name, total)
        for name in ("labels", "offsets", "image_offsets", "image_sizes", "image_exts")
    }
    key_sizes = np.array([int(h["keys_size"]) for h in heads], dtype=np.int64)
    if (key_sizes < 0).any():
        raise ValueError("a shard has a negative keys_size")
    key_starts = np.concatenate([[0], np.cumsum(key_sizes)])
    blob = memoryview(_decode_column(doc, "keys", int(key_starts[-1])))
    if len(cols["image_exts"]) and int(cols["image_exts"].max()) >= len(exts):
        raise ValueError("an image type code is outside the list of types")
    limit = np.repeat(np.array([e.bytes for e in entries], np.int64), counts)
    for what in ("offsets", "image_offsets", "image_sizes"):
        outside = np.flatnonzero(cols[what].astype(np.int64) > limit)
        if len(outside) or (cols[what].dtype.kind == "i" and (cols[what] < 0).any()):
            s = int(np.searchsorted(np.cumsum(counts), outside[0], "right")) if len(outside) else 0
            raise ValueError(
                f"shard {entries[s].name}: {what} outside the shard's {entries[s].bytes} bytes"
            )
    starts = np.concatenate([[0], np.cumsum(counts)])
    for i, (e, h, a, b) in enumerate(zip(entries, heads, starts[:-1], starts[1:], strict=True)):
        e.keys = Keys(blob[key_starts[i] : key_starts[i + 1]], int(b - a))
        e.labels, e.offsets = cols["labels"][a:b], cols["offsets"][a:b]
        if h.get("indexed", True):
            e.image_offsets, e.image_sizes = cols["image_offsets"][a:b], cols["image_sizes"][a:b]
            e.image_exts = _Exts(exts, cols["image_exts"][a:b])
    return entries


class _Exts(Sequence[str]):
    """Image types as one byte per sample, read as strings."""

    def __init__(self, table: list[str], codes: np.ndarray) -> None:
        self._table, self._codes = table, codes

    def __len__(self) -> int:
        return len(self._codes)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._table[c] for c in self._codes[i]]
        return self._table[self._codes[i]]


def split_name(name: str) -> tuple[str, str]:
    """WebDataset convention: the key is everything before the first dot of the basename."""
    path = PurePosixPath(name)
    base, _, ext = path.name.partition(".")
    key = str(path.parent / base) if str(path.parent) != "." else base
    return key, ext.lower()


def check_shard_name(name: str) -> None:
    """A shard name from the index: a relative path inside the data set, without NUL or control
    characters (it becomes part of local paths and URLs)."""
    if _CONTROL.search(name):
        raise ShardError(f"shard name {name!r} holds a NUL or control character; rejected")
    if any(part in ("", ".") for part in name.split("/")):
        raise ShardError(f"shard name {name!r} is not a plain relative file path; rejected")
    _check_name(name, name)


def _ext(name: str) -> str:
    """`split_name(name)[1]`, without pathlib for plain names (it runs for every sample)."""
    if "/." in name or "//" in name or name.endswith("/"):
        return split_name(name)[1]
    return name.rsplit("/", 1)[-1].partition(".")[2].lower()


def _check_name(name: str, shard: str) -> None:
    # pathlib's parts differ from a split on "/" only in dropping "" and "." components
    if (
        name.startswith(("/", "\\"))
        or ".." in name.split("/")
        or "\\" in name
        or ":" in name.split("/")[0]
    ):
        raise ShardError(f"shard {shard}: member name {name!r} escapes its directory; rejected")


def _check_member(info: tarfile.TarInfo, shard: str) -> None:
    """Reject a member gpufeed will not read: an escaping name, a link, a device or FIFO, a
    pickle. A directory entry (GNU tar writes one per folder) holds nothing and is skipped."""
    _check_name(info.name.rstrip("/"), shard)
    if info.isdir():
        return
    if info.islnk() or info.issym():
        raise ShardError(f"shard {shard}: member {info.name!r} is a link; links are rejected")
    if not info.isreg():
        raise ShardError(f"shard {shard}: member {info.name!r} is not a regular file; rejected")
    _check_not_pickle(info.name, shard)


def _check_not_pickle(name: str, shard: str) -> None:
    if _ext(name).rsplit(".", 1)[-1] in FORBIDDEN_EXTS:
        raise ShardError(
            f"shard {shard}: member {name!r} may hold pickled objects; "
            "gpufeed never unpickles, so shards with such members are rejected"
        )


def _regular_header(block: bytes, types: tuple[int, ...] = (0x30, 0)) -> tuple[str, int] | None:
    """(name, size) of a plain regular-file tar header (no prefix field, octal size, valid
    checksum), read as `tarfile.TarInfo.frombuf` reads it but several times faster; None for any
    other block, which tarfile then reads and judges. (`types`: other header types to accept.)"""
    if len(block) != 512 or block[156] not in types or block[345] or block[124] & 0x80:
        return None
    try:  # every numeric field, as tarfile's nti (base-256 ones are valid; size is octal here)
        _, _, _, size, _, chksum, _, _ = (
            int(block[a:b].split(b"\0", 1)[0].strip() or b"0", 8)
            if block[a] not in (0o200, 0o377)
            else 0
            for a, b in _NUMERIC_FIELDS
        )
    except ValueError:
        return None
    if chksum != 256 + sum(block) - sum(block[148:156]):
        return None
    name = block[:100].split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")
    return None if name.endswith("/") else (name, size)  # a trailing slash: a V7 directory


def _check_regular_header(block: bytes, shard: str) -> tuple[str, int] | None:
    """Check a plain regular-file header as `_check_member` would; None if it is not one."""
    fast = _regular_header(block)
    if fast is not None:
        _check_name(fast[0], shard)
        _check_not_pickle(fast[0], shard)
    return fast


def iter_samples(fileobj: BinaryIO, shard: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield (key, {ext: bytes}) for consecutive members sharing a key, from the file's position on.

    Raises ShardError for truncated data and for rejected members (links, escaping names, pickles).
    """
    key: str | None = None
    parts: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for info in tar:
                _check_member(info, shard)
                if info.isdir():
                    continue
                k, ext = split_name(info.name)
                if k != key:
                    if key is not None:
                        yield key, parts
                    key, parts = k, {}
                if ext in IMAGE_EXTS or ext in META_EXTS:
                    f = tar.extractfile(info)
                    assert f is not None
                    data = f.read()
                    if len(data) != info.size:
                        raise ShardError(f"shard {shard} is truncated inside member {info.name!r}")
                    parts[ext] = data
    except (tarfile.TarError, EOFError) as e:
        raise ShardError(f"shard {shard} is truncated or not a tar file ({e})") from e
    if key is not None:
        yield key, parts


def read_indexed(
    fileobj: BinaryIO, entry: ShardEntry, first: int, count: int, shard: str
) -> Iterator[tuple[str, bytes]]:
    """Yield (key, image bytes) of samples `first`.. (`count` of them) read at their index offsets.

    `fileobj` must be positioned at `entry.offsets[first]`. Reads each image and the bytes in
    front of it, and checks their tar headers (the data of other members is not interpreted): the
    header right before each image must be a valid regular-file header with the index's name and
    size, and the stretch between two images must be whole, valid members. With the shard's last
    sample, the rest of the shard is read and checked the same way, up to exactly `entry.bytes`
    (so a source reading from byte 0 sees the whole shard and can verify its checksum) before that
    sample is yielded. So an unsafe member (link, escaping name, pickle-capable type), a truncated
    or overlong shard, or an index that disagrees with its shard is a ShardError as with
    `iter_samples`. Members before `first` that are not read are not checked.
    """
    pos = int(entry.offsets[first])
    for i in range(first, first + count):
        start, image = int(entry.offsets[i]), int(entry.image_offsets[i])
        size = int(entry.image_sizes[i])
        name = f"{entry.keys[i]}.{entry.image_exts[i]}"
        if not pos <= start <= image - 512 or size < 0 or (i > first and start < _padded(pos)):
            raise ShardError(
                f"shard {shard}: the index's offsets of sample {i} ({name!r}) are out of order; "
                "the index is corrupt, re-create it with `gpufeed pack`"
            )
        head = _read_exactly(fileobj, image - pos, shard, entry, i)
        data = _read_exactly(fileobj, size, shard, entry, i)
        if i > first:  # the members between the previous image and this sample (its .cls, ...)
            _check_members(head[_padded(pos) - pos : start - pos], shard, end=False)
        if image - start == 512:
            _check_image_header(head[-512:], name, size, shard)
        elif _plain_members_then(head[start - pos :], name, size, shard):
            pass  # members of the sample before its image (WebDataset writes `.cls` first)
        else:  # extension headers (long name): let tarfile read this one sample
            _check_with_tarfile(head[start - pos :], data, name, shard)
        pos = image + size
        if i == entry.samples - 1:
            _check_tail(fileobj, entry, pos, shard)
        yield entry.keys[i], data


# pax records that change nothing gpufeed relies on (not the path, size or link of a member)
_HARMLESS_PAX = frozenset({b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname"})


def _harmless_pax(buf: bytes, q: int) -> int | None:
    """Where the next header starts if `buf[q:]` begins with a pax extended header that only sets
    times or owners (Python's tarfile writes one for every float mtime, as webdataset does);
    None for anything else."""
    pax = _regular_header(buf[q : q + 512], types=(0x78,))
    if pax is None or q + 512 + pax[1] > len(buf):
        return None
    data, pos = buf[q + 512 : q + 512 + pax[1]], 0
    try:
        while pos < len(data):
            length = int(data[pos : data.index(b" ", pos)])
            record = data[pos : pos + length]
            if length <= 0 or not record.endswith(b"\n"):
                return None
            if record.split(b" ", 1)[1].split(b"=", 1)[0] not in _HARMLESS_PAX:
                return None
            pos += length
    except (ValueError, IndexError):
        return None
    return q + 512 + _padded(pax[1])


def _plain_members_then(head: bytes, name: str, size: int, shard: str) -> bool:
    """True once checked that `head` is whole plain members of the sample's key, then the image's
    plain header; False (nothing concluded) when any header is not a plain regular one."""
    key = name[: -len(_ext(name)) - 1]
    q, end = 0, len(head) - 512
    while q < end:
        after_pax = _harmless_pax(head, q)
        if after_pax is not None:
            q = after_pax
            continue
        fast = _check_regular_header(head[q : q + 512], shard)
        if fast is None or not fast[0].startswith(key + "."):
            return False
        q += 512 + _padded(fast[1])
    if q != end:
        return False
    _check_image_header(head[end:], name, size, shard)
    return True


def _check_tail(fileobj: BinaryIO, entry: ShardEntry, pos: int, shard: str) -> None:
    """After the last image: the remaining members up to the end-of-archive marker are checked,
    then only zeros may follow, up to exactly `entry.bytes` (reading to the end lets the source
    verify the shard's checksum)."""
    n = entry.bytes - pos
    tail = fileobj.read(n) if _padded(pos) <= entry.bytes else b""
    if _padded(pos) > entry.bytes or len(tail) != n:
        raise ShardError(
            f"shard {shard} is truncated after its last sample ({entry.keys[-1]!r}); "
            f"the index says it has {entry.bytes} bytes"
        )
    _check_members(tail[_padded(pos) - pos :], shard, end=True)
    if fileobj.read(1):
        raise ShardError(
            f"shard {shard} is longer than the {entry.bytes} bytes the index says: it was "
            "changed after packing; re-create it with `gpufeed pack`"
        )


_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)
# mode, uid, gid, size, mtime, chksum, devmajor, devminor: (start, end) in a tar header
_NUMERIC_FIELDS = (
    (100, 108),
    (108, 116),
    (116, 124),
    (124, 136),
    (136, 148),
    (148, 156),
    (329, 337),
    (337, 345),
)


def _check_members(buf: bytes, shard: str, *, end: bool) -> None:
    """Validate every member in `buf`, which starts at a tar header: the whole of it must be
    members (and, with `end`, then the end-of-archive marker and zeros only)."""
    q = 0
    while q < len(buf):
        block = buf[q : q + 512]
        if end and not block.strip(b"\0"):  # end-of-archive: zeros to the end
            if buf[q:].strip(b"\0"):
                raise ShardError(
                    f"shard {shard}: data after the end-of-archive marker; the shard is corrupt"
                )
            return
        fast = _check_regular_header(block, shard)
        if fast is not None:
            q += 512 + _padded(fast[1])
            continue
        info = _parse_header(block, shard, "where the next member should start")
        if info.type not in _REGULAR:  # extension headers, links, ...: let tarfile read them
            _check_with_tarfile_only(buf[q:], shard, end=end)
            return
        _check_member(info, shard)
        q += 512 + _padded(info.size)
    if q != len(buf):
        raise ShardError(
            f"shard {shard}: a member runs past where the index puts the next sample (or the "
            "shard's end); the shard is corrupt or the index does not belong to it"
        )


def _check_with_tarfile_only(buf: bytes, shard: str, *, end: bool) -> None:
    """`_check_members` for a stretch holding extension headers (long names, pax) or worse."""
    stream = io.BytesIO(buf if end else buf + b"\0" * 1024)
    try:
        with tarfile.open(fileobj=stream, mode="r:") as tar:
            for info in tar:
                _check_member(info, shard)
            stop = tar.offset
    except tarfile.TarError as e:
        raise ShardError(f"shard {shard}: invalid tar headers between samples ({e})") from e
    if buf[stop:].strip(b"\0") if end else stop != len(buf):
        raise ShardError(
            f"shard {shard}: no valid tar header where the next member should start; the shard "
            "is corrupt or the index does not belong to this shard"
        )


def _read_exactly(fileobj: BinaryIO, n: int, shard: str, entry: ShardEntry, i: int) -> bytes:
    data = fileobj.read(n)
    if len(data) != n:
        raise ShardError(
            f"shard {shard} is truncated inside sample {i} ({entry.keys[i]!r}); "
            f"the index lists {entry.samples} samples"
        )
    return data


def _parse_header(block: bytes, shard: str, where: str) -> tarfile.TarInfo:
    """The tar header in `block`, or a ShardError saying there is none `where` one should be."""
    try:
        return tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError as e:
        raise ShardError(
            f"shard {shard}: no valid tar header {where} ({e}); the shard is corrupt or the index "
            "does not belong to this shard"
        ) from e


def _check_image_header(block: bytes, name: str, size: int, shard: str) -> None:
    fast = _check_regular_header(block, shard)
    if fast is not None:
        _check_agrees(fast[0], fast[1], name, size, shard)
        return
    info = _parse_header(block, shard, f"in front of {name!r}")
    _check_member(info, shard)
    _check_agrees(info.name, info.size, name, size, shard)


def _check_with_tarfile(head: bytes, data: bytes, name: str, shard: str) -> None:
    pad = b"\0" * (_padded(len(data)) - len(data) + 1024)  # complete the archive after this member
    got = list(iter_samples(io.BytesIO(head + data + pad), shard))
    key, ext = split_name(name)
    ok = len(got) == 1 and got[0][0] == key and got[0][1].get(ext) == data
    found = name if ok else (got[0][0] if got else "nothing")
    _check_agrees(found, len(data) if ok else -1, name, len(data), shard)


def _check_agrees(found: str, found_size: int, name: str, size: int, shard: str) -> None:
    # a member name the key came from: `tar -C DIR -cf x.tar .` writes ./KEY.jpg (see split_name)
    if (found != name and str(PurePosixPath(found)) != name) or found_size != size:
        raise ShardError(
            f"shard {shard}: found member {found!r} ({found_size} bytes) where the index puts "
            f"{name!r} ({size} bytes); the index does not belong to this shard"
        )
    if _ext(name) not in IMAGE_EXTS:
        raise ShardError(f"shard {shard}: the index lists {name!r} as an image; rejected")


class ShardWriter:
    """Write one shard to a binary file, recording the per-sample offsets for the index."""

    def __init__(self, fileobj: BinaryIO, name: str) -> None:
        self.entry = ShardEntry(name=name)
        self._tar = tarfile.open(fileobj=fileobj, mode="w", format=tarfile.GNU_FORMAT)  # noqa: SIM115

    @property
    def size(self) -> int:
        return self._tar.offset

    def add(self, key: str, image: bytes, ext: str, label: int) -> None:
        """Append `<key>.<ext>` (the image) and `<key>.cls` (the label as text)."""
        self.entry.offsets.append(self._tar.offset)
        self._add(f"{key}.{ext}", image)
        self.entry.image_offsets.append(self._tar.offset - _padded(len(image)))
        self.entry.image_sizes.append(len(image))
        self.entry.image_exts.append(ext)
        self._add(f"{key}.cls", str(label).encode())
        self.entry.keys.append(key)
        self.entry.labels.append(label)

    def _add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> ShardEntry:
        """Finish the tar; the caller fills in `bytes` and `sha256` of the finished file."""
        self._tar.close()
        return self.entry


def _padded(n: int) -> int:
    return (n + 511) // 512 * 512


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a local file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
