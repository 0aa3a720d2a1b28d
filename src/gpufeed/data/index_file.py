"""The index, `gpufeed-index.json` (`index.json` in data sets packed before; still read): its
schema (`Index`, `ShardEntry`, `Keys`), its columns' encoding, and its validation.

The index is validated when it is parsed (`Index.from_bytes`): its shape, shard names (relative,
inside the data set, no NUL or control characters, each listed once), checksums (64 hex digits, or
empty for none), counts (whole numbers), offsets (inside the shard) and labels (class ids: 0 up
to the number of classes it lists). What it promises is checked on read: `Source` checks each shard's
size and, whenever a shard is read from start to end, its SHA-256 (see `gpufeed.data.source`).
The index has no per-sample checksums, so bytes altered inside one image are only found by that
whole-shard check (or, if the image no longer decodes, as a corrupt sample).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gpufeed.data.tar_scan import ShardError, _check_name

INDEX_NAME = "gpufeed-index.json"


# written by gpufeed before 0.2 (and the name MosaicML Streaming and litdata use): still read
LEGACY_INDEX_NAME = "index.json"


INDEX_VERSION = 2


IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp"})


MAX_LABEL = 1_000_000  # a numeric label above this is a mistake, not a class number


SHA256_HEX = re.compile(r"[0-9a-f]{64}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# numpy dtypes an index column may be stored as (little-endian, fixed size: never objects)
_COLUMN_DTYPES = frozenset({"|u1", "<u2", "<u4", "<u8", "<i2", "<i4", "<i8"})


def has_index(directory: str | os.PathLike[str]) -> bool:
    """True if a local directory holds a gpufeed index (either name)."""
    return any(os.path.isfile(os.path.join(directory, n)) for n in (INDEX_NAME, LEGACY_INDEX_NAME))


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
        entry.labels = _integers(d["labels"], "labels", entry.name)
        entry.offsets = _integers(d["offsets"], "offsets", entry.name)
        entry.image_offsets = _integers(d.get("image_offsets", []), "image_offsets", entry.name)
        entry.image_sizes = _integers(d.get("image_sizes", []), "image_sizes", entry.name)
        entry.image_exts = [str(x) for x in d.get("image_exts", [])]
        n = entry.samples
        samples = _whole(d.get("samples", n), "samples", entry.name)
        if not (len(entry.labels) == len(entry.offsets) == n) or samples != n:
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
    return ShardEntry(name=name, bytes=_whole(d["bytes"], "bytes", name), sha256=sha)


def _whole(value: Any, what: str, shard: str) -> int:
    """A count from the index: a JSON integer, 0 or more. int() alone would round 71680.5 down
    and take "12" or true; infinity and NaN are refused in int()'s words."""
    n = int(value)
    if type(value) is not int or n < 0:
        raise ValueError(f"shard {shard}: {what} is {value!r}, not a whole number of 0 or more")
    return n


def _integers(values: Any, what: str, shard: str) -> list[int]:
    """A version-1 index's per-sample list, each a JSON integer (their ranges are checked later)."""
    if not isinstance(values, list):
        raise ValueError(f"shard {shard}: {what} is {type(values).__name__}, not a list")
    for x in values:
        if type(x) is not int:
            raise ValueError(f"shard {shard}: {what} holds {x!r}, not a whole number")
    return values


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
            return cls(classes, _columns_to_shards(doc, len(classes)))
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


def _columns_to_shards(doc: dict[str, Any], classes: int) -> list[ShardEntry]:
    """Version 2: the shards, their per-sample columns as views into the index's arrays."""
    heads = doc["shards"]
    entries: list[ShardEntry] = []
    listed: dict[str, int] = {}
    for h in heads:
        if not isinstance(h, dict):
            raise ValueError(f"a shard entry is {type(h).__name__}, not an object")
        entries.append(_entry_head(h))
        name = entries[-1].name
        if name in listed:
            raise ValueError(
                f"shard {name} is listed twice (entries {listed[name]} and {len(entries) - 1}): "
                "its samples would be read twice an epoch"
            )
        listed[name] = len(entries) - 1
    counts = np.array(
        [_whole(h["samples"], "samples", e.name) for h, e in zip(heads, entries, strict=True)],
        dtype=np.int64,
    )
    total = int(counts.sum())
    if doc.get("total", total) != total or type(doc.get("total", total)) is not int:
        raise ValueError(f"total {doc['total']!r} is not the sum of the shards' samples ({total})")
    exts = [str(e) for e in doc["exts"]]
    if bad := [e for e in exts if e.lower() not in IMAGE_EXTS]:  # as written: .JPEG too
        raise ValueError(f"image type {bad[0][:20]!r} is not one of {sorted(IMAGE_EXTS)}")
    cols = {
        name: _decode_column(doc, name, total)
        for name in ("labels", "offsets", "image_offsets", "image_sizes", "image_exts")
    }
    key_sizes = np.array(
        [_whole(h["keys_size"], "keys_size", e.name) for h, e in zip(heads, entries, strict=True)],
        dtype=np.int64,
    )
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
    _check_labels(cols["labels"], classes, entries, starts)
    return entries


def _check_labels(
    labels: np.ndarray, classes: int, entries: list[ShardEntry], starts: np.ndarray
) -> None:
    """Every label a class id: 0 or more and, when the index lists classes, under their number
    (a label past the classes fails training far from its cause: a CUDA assert in the loss)."""
    wrong = labels < 0 if labels.dtype.kind == "i" else np.zeros(len(labels), bool)
    if classes:
        wrong |= labels >= classes
    bad = np.flatnonzero(wrong)
    if not len(bad):
        return
    j = int(bad[0])
    s = int(np.searchsorted(starts, j, "right")) - 1
    entry, value = entries[s], int(labels[j])
    why = (
        "a class id is never negative"
        if value < 0
        else f"the index lists {classes} classes, ids 0 to {classes - 1}"
    )
    raise ValueError(
        f"shard {entry.name}: sample {j - int(starts[s])} ({entry.keys[j - int(starts[s])]!r}) "
        f"has label {value}, not a class id: {why}"
    )


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


def check_shard_name(name: str) -> None:
    """A shard name from the index: a relative path inside the data set, without NUL or control
    characters (it becomes part of local paths and URLs)."""
    if _CONTROL.search(name):
        raise ShardError(f"shard name {name!r} holds a NUL or control character; rejected")
    if any(part in ("", ".") for part in name.split("/")):
        raise ShardError(f"shard name {name!r} is not a plain relative file path; rejected")
    _check_name(name, name)
