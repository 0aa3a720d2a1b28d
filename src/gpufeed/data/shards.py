"""The shard format: tar files in WebDataset layout (`<key>.jpg`, `<key>.cls`), how they are read
and written; the index that lists them is `gpufeed.data.index_file`'s (its names are importable
from here too).

Writing is deterministic (fixed mtime/owner) so a re-pack gives identical bytes. Reading goes
straight to the image offsets recorded in the index (`read_indexed`), checking the tar header in
front of each image and the headers of the members between the images it reads; shards without
offsets are parsed member by member (`iter_samples`). Either way every header read is checked by
`gpufeed.data.tar_scan`, the scanner `gpufeed index` uses, with its one set of rules: regular files
only (no links, devices or sparse files), no names that escape a directory, no member type that
could be unpickled (`FORBIDDEN_EXTS`), no size past the shard's end; so shards are safe to read
from untrusted storage, and what `index` accepts is read. Only the extensions in
`IMAGE_EXTS`/`META_EXTS` are interpreted; other unknown members are ignored.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import BinaryIO

from gpufeed.data.index_file import (  # noqa: F401 - their old home
    IMAGE_EXTS,
    INDEX_NAME,
    INDEX_VERSION,
    LEGACY_INDEX_NAME,
    MAX_LABEL,
    SHA256_HEX,
    Index,
    Keys,
    ShardEntry,
    check_shard_name,
    has_index,
)
from gpufeed.data.tar_scan import (
    BLOCK,
    BadHeader,
    ShardError,
    Tape,
    members,
    padded,
    samples,
    split_name,
    walk_to,
)

META_EXTS = frozenset({"cls", "json", "txt"})


def shard_name(number: int) -> str:
    """File name of shard `number`."""
    return f"shard-{number:05d}.tar"


def iter_samples(
    fileobj: BinaryIO, shard: str, start: int = 0, end: int | None = None
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield (key, {ext: bytes}) of the image and metadata members (`IMAGE_EXTS`, `META_EXTS`) of
    each sample, from the file's position (shard byte `start`) to the shard's end, byte `end`
    (by default: where the file ends).

    Raises ShardError as `gpufeed index` would: members `tar_scan` refuses (links, escaping
    names, pickles, sparse files, sizes past the shard's end), a truncated shard, keys repeated.
    """
    if end is None:
        try:
            here = fileobj.tell()
            end = start + fileobj.seek(0, os.SEEK_END) - here
            fileobj.seek(here)
        except (OSError, AttributeError, ValueError):  # not seekable: hold it whole
            data = fileobj.read()
            fileobj, end = io.BytesIO(data), start + len(data)
    tape = Tape(shard, b"", start, end, read=fileobj.read)
    found = members(tape, start, end, end=True, keep=_READ_EXTS)
    for key, _, parts in samples(found, shard):
        yield key, {ext: data for ext, (_, data) in parts.items() if data is not None}


_READ_EXTS = IMAGE_EXTS | META_EXTS


def read_indexed(
    fileobj: BinaryIO, entry: ShardEntry, first: int, count: int, shard: str
) -> Iterator[tuple[str, bytes]]:
    """Yield (key, image bytes) of samples `first`.. (`count` of them) read at their index offsets.

    `fileobj` must be positioned at `entry.offsets[first]`. Reads each image and the bytes in
    front of it and checks every tar header there by `tar_scan`'s rules, the rules `gpufeed
    index` applied (the data of other members is not interpreted): the member right before each
    image must carry the index's name and size. With the shard's last sample, the rest of the
    shard is read and checked the same way, up to exactly `entry.bytes` (so a source reading
    from byte 0 sees the whole shard and can verify its checksum) before that sample is yielded.
    So an unsafe member (link, escaping name, pickle-capable type), a truncated or overlong
    shard, or an index that disagrees with its shard is a ShardError as with `iter_samples`.
    Members before `first` that are not read are not checked.
    """
    pos = int(entry.offsets[first])
    for i in range(first, first + count):
        start, image = int(entry.offsets[i]), int(entry.image_offsets[i])
        size = int(entry.image_sizes[i])
        name = f"{entry.keys[i]}.{entry.image_exts[i]}"
        at = start if i == first else padded(pos)  # past the previous image's padding
        if not pos <= at <= start <= image - BLOCK or size < 0:
            raise ShardError(
                f"shard {shard}: the index's offsets of sample {i} ({name!r}) are out of order; "
                "the index is corrupt, re-create it with `gpufeed pack` (or `gpufeed index`)"
            )
        head = _read_exactly(fileobj, image - pos, shard, entry, i)
        data = _read_exactly(fileobj, size, shard, entry, i)
        try:  # every member from the previous image on (its .cls, ...), then this image's
            found = walk_to(Tape(shard, head, pos, entry.bytes), at, image)
        except BadHeader as e:
            raise _no_header(shard, e, start if i == first else -1, image, i, name) from None
        _check_agrees(found.name, found.size, name, size, shard)
        pos = image + size
        if i == entry.samples - 1:
            _check_tail(fileobj, entry, pos, shard)
        yield entry.keys[i], data


def _no_header(shard: str, e: BadHeader, start: int, image: int, i: int, name: str) -> ShardError:
    """`e` said as the index's offsets make it: where they put an image, a sample or neither."""
    if e.at == image - BLOCK or e.at != start:
        where = "where the next member should start"
        if e.at == image - BLOCK:
            where = f"in front of {name!r}"
        return ShardError(
            f"shard {shard}: no valid tar header {where} (byte {e.at}: invalid header, "
            f"{e.reason}); the shard is corrupt or the index does not belong to this shard"
        )
    return ShardError(
        f"shard {shard} has no valid tar header at byte {e.at}, where the index puts sample {i} "
        f"({name!r}): invalid header ({e.reason}); the index does not belong to this shard: "
        "re-create it with `gpufeed index`"
    )


def _check_tail(fileobj: BinaryIO, entry: ShardEntry, pos: int, shard: str) -> None:
    """After the last image: the remaining members and tar's end-of-archive marker are checked,
    up to exactly `entry.bytes` (reading to the end lets the source verify the shard's
    checksum)."""
    n = entry.bytes - pos
    tail = fileobj.read(n) if padded(pos) <= entry.bytes else b""
    if padded(pos) > entry.bytes or len(tail) != n:
        raise ShardError(
            f"shard {shard} is truncated after its last sample ({entry.keys[-1]!r}); "
            f"the index says it has {entry.bytes} bytes"
        )
    tape = Tape(shard, tail, pos, entry.bytes)
    try:
        for _ in members(tape, padded(pos), entry.bytes, end=True, keep=()):
            pass
    except BadHeader as e:
        raise _no_header(shard, e, -1, -1, -1, "") from None
    if fileobj.read(1):
        raise ShardError(
            f"shard {shard} is longer than the {entry.bytes} bytes the index says: it was "
            "changed after packing; re-create it with `gpufeed pack`"
        )


def _read_exactly(fileobj: BinaryIO, n: int, shard: str, entry: ShardEntry, i: int) -> bytes:
    data = fileobj.read(n)
    if len(data) != n:
        raise ShardError(
            f"shard {shard} is truncated inside sample {i} ({entry.keys[i]!r}); "
            f"the index lists {entry.samples} samples"
        )
    return data


def _check_agrees(found: str, found_size: int, name: str, size: int, shard: str) -> None:
    # a member name the key came from: `tar -C DIR -cf x.tar .` writes ./KEY.jpg (see split_name)
    if (found != name and str(PurePosixPath(found)) != name) or found_size != size:
        raise ShardError(
            f"shard {shard}: found member {found!r} ({found_size} bytes) where the index puts "
            f"{name!r} ({size} bytes); the index does not belong to this shard"
        )
    if split_name(name)[1] not in IMAGE_EXTS:
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
        self.entry.image_offsets.append(self._tar.offset - padded(len(image)))
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


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a local file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
