"""The shard format: tar files in WebDataset layout (`<key>.jpg`, `<key>.cls`) plus `index.json`.

Writing is deterministic (fixed mtime/owner) so a re-pack gives identical bytes. Reading goes
straight to the image offsets recorded in index.json (`read_indexed`), checking the tar header in
front of each image; shards without offsets are parsed member by member (`iter_samples`). Either way
every member read is validated: no links, no names that escape a directory, and no member type that
could be unpickled (see `FORBIDDEN_EXTS`), so shards are safe to read from untrusted storage. Only the extensions in `IMAGE_EXTS`/`META_EXTS` are interpreted; other
unknown members are ignored.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, BinaryIO

INDEX_NAME = "index.json"
INDEX_VERSION = 1
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp"})
META_EXTS = frozenset({"cls", "json", "txt"})
# Members that could carry pickled Python objects: a shard holding one is rejected outright.
FORBIDDEN_EXTS = frozenset({"pyd", "pickle", "pkl", "pth", "pt", "ckpt", "joblib", "npy", "npz"})


class ShardError(Exception):
    """A shard or index is missing, truncated or malformed; the message names it."""


def shard_name(number: int) -> str:
    """File name of shard `number`."""
    return f"shard-{number:05d}.tar"


@dataclass
class ShardEntry:
    """One shard as recorded in index.json: per-sample keys, labels and byte offsets."""

    name: str
    bytes: int = 0
    sha256: str = ""
    keys: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # start of each sample's first tar header
    image_offsets: list[int] = field(default_factory=list)  # start of each sample's image bytes
    image_sizes: list[int] = field(default_factory=list)
    image_exts: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return len(self.keys)

    @property
    def indexed(self) -> bool:
        """True when index.json records every image's offset, size and type (`read_indexed` works)."""
        n = self.samples
        return len(self.image_offsets) == len(self.image_sizes) == len(self.image_exts) == n

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "keys": self.keys,
            "labels": self.labels,
            "offsets": self.offsets,
            "image_offsets": self.image_offsets,
            "image_sizes": self.image_sizes,
            "image_exts": self.image_exts,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardEntry:
        entry = cls(
            name=str(d["name"]),
            bytes=int(d["bytes"]),
            sha256=str(d.get("sha256", "")),
            keys=[str(k) for k in d["keys"]],
            labels=[int(x) for x in d["labels"]],
            offsets=[int(x) for x in d["offsets"]],
            image_offsets=[int(x) for x in d.get("image_offsets", [])],
            image_sizes=[int(x) for x in d.get("image_sizes", [])],
            image_exts=[str(x) for x in d.get("image_exts", [])],
        )
        n = entry.samples
        if not (len(entry.labels) == len(entry.offsets) == n) or int(d.get("samples", n)) != n:
            raise ValueError(f"shard {entry.name}: keys/labels/offsets lengths differ")
        _check_name(entry.name, entry.name)
        return entry


@dataclass
class Index:
    """The contents of index.json: class names and the shards in order."""

    classes: list[str]
    shards: list[ShardEntry]

    @property
    def total(self) -> int:
        return sum(s.samples for s in self.shards)

    def to_bytes(self) -> bytes:
        doc = {
            "format": "gpufeed-shards",
            "version": INDEX_VERSION,
            "classes": self.classes,
            "total": self.total,
            "shards": [s.to_json() for s in self.shards],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Index:
        """Parse index.json; `where` names it in errors."""
        try:
            doc = json.loads(data)
            if doc.get("format") != "gpufeed-shards":
                raise ValueError("not a gpufeed index (missing format: gpufeed-shards)")
            if int(doc.get("version", 0)) > INDEX_VERSION:
                raise ValueError(f"index version {doc['version']} is newer than this gpufeed")
            return cls(
                classes=[str(c) for c in doc["classes"]],
                shards=[ShardEntry.from_json(s) for s in doc["shards"]],
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ShardError(
                f"{where}: invalid index: {e}; re-create it with `gpufeed pack`"
            ) from e


def split_name(name: str) -> tuple[str, str]:
    """WebDataset convention: the key is everything before the first dot of the basename."""
    path = PurePosixPath(name)
    base, _, ext = path.name.partition(".")
    key = str(path.parent / base) if str(path.parent) != "." else base
    return key, ext.lower()


def _check_name(name: str, shard: str) -> None:
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or ".." in parts or "\\" in name or ":" in name.split("/")[0]:
        raise ShardError(f"shard {shard}: member name {name!r} escapes its directory; rejected")


def _check_member(info: tarfile.TarInfo, shard: str) -> None:
    _check_name(info.name, shard)
    if info.islnk() or info.issym():
        raise ShardError(f"shard {shard}: member {info.name!r} is a link; links are rejected")
    if not info.isreg():
        raise ShardError(f"shard {shard}: member {info.name!r} is not a regular file; rejected")
    if split_name(info.name)[1].rsplit(".", 1)[-1] in FORBIDDEN_EXTS:
        raise ShardError(
            f"shard {shard}: member {info.name!r} may hold pickled objects; "
            "gpufeed never unpickles, so shards with such members are rejected"
        )


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

    `fileobj` must be positioned at `entry.offsets[first]`. Reads only each image and the headers
    in front of it (no tar parse of the other members); the header right before each image must be
    a valid regular-file header with the index's name and size, so an unsafe member, a truncated
    shard or an index that disagrees with its shard is a ShardError as with `iter_samples`.
    """
    pos = entry.offsets[first]
    for i in range(first, first + count):
        start, image, size = entry.offsets[i], entry.image_offsets[i], entry.image_sizes[i]
        name = f"{entry.keys[i]}.{entry.image_exts[i]}"
        if not pos <= start <= image - 512 or size < 0:
            raise ShardError(
                f"shard {shard}: index.json offsets of sample {i} ({name!r}) are out of order; "
                "the index is corrupt, re-create it with `gpufeed pack`"
            )
        head = _read_exactly(fileobj, image - pos, shard, entry, i)
        data = _read_exactly(fileobj, size, shard, entry, i)
        if image - start == 512:
            _check_image_header(head[-512:], name, size, shard)
        else:  # extension headers (long name): let tarfile read this one sample
            _check_with_tarfile(head[start - pos :], data, name, shard)
        pos = image + size
        yield entry.keys[i], data


def _read_exactly(fileobj: BinaryIO, n: int, shard: str, entry: ShardEntry, i: int) -> bytes:
    data = fileobj.read(n)
    if len(data) != n:
        raise ShardError(
            f"shard {shard} is truncated inside sample {i} ({entry.keys[i]!r}); "
            f"index.json lists {entry.samples} samples"
        )
    return data


def _check_image_header(block: bytes, name: str, size: int, shard: str) -> None:
    try:
        info = tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError as e:
        raise ShardError(
            f"shard {shard}: no valid tar header in front of {name!r} ({e}); the shard is "
            "corrupt or the index does not belong to this shard"
        ) from e
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
    if found != name or found_size != size:
        raise ShardError(
            f"shard {shard}: found member {found!r} ({found_size} bytes) where index.json puts "
            f"{name!r} ({size} bytes); the index does not belong to this shard"
        )
    if split_name(name)[1] not in IMAGE_EXTS:
        raise ShardError(f"shard {shard}: index.json lists {name!r} as an image; rejected")


class ShardWriter:
    """Write one shard to a binary file, recording the per-sample offsets for index.json."""

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
