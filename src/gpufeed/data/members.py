"""Read indexed samples whole: the image and every other member of the sample (`.cls`, `.json`,
`.txt`), for a Loader asked for `extras` (`gpufeed.data.sample_extras`).

`shards.read_indexed` reads only up to each image: the members a WebDataset sample has after its
image (gpufeed writes `.cls` after `.jpg`; webdataset writes members in sorted order, so `.json`
and `.txt` come after `.jpg`) are never read. Here each sample is read from its first header to
the next sample's (`offsets[i]`..`offsets[i + 1]`; the last one to the shard's end) and checked as
`read_indexed` checks what it reads: every member header (no links, no escaping names, nothing
that could be unpickled), the image where the index puts it, and after the last sample only the
end-of-archive marker up to exactly the shard's size (so a reader from byte 0 can verify the
checksum).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from gpufeed.data.shards import (
    ShardEntry,
    ShardError,
    _check_agrees,
    _check_members,
    _check_regular_header,
    _harmless_pax,
    _padded,
    split_name,
)

# (member name, where its data starts in the shard, its data)
Member = tuple[str, int, bytes]


def read_with_members(
    fileobj: BinaryIO, entry: ShardEntry, first: int, count: int, shard: str
) -> Iterator[tuple[str, bytes, dict[str, bytes]]]:
    """(key, image bytes, {extension: bytes} of the sample's other members) of samples `first`..
    (`count` of them), as `read_indexed` yields (key, image bytes); `fileobj` must be positioned
    at `entry.offsets[first]`, and is read up to `entry.offsets[first + count]` (or the end)."""
    for i in range(first, first + count):
        key, start = entry.keys[i], int(entry.offsets[i])
        last = i == entry.samples - 1
        end = entry.bytes if last else int(entry.offsets[i + 1])
        image, size = int(entry.image_offsets[i]), int(entry.image_sizes[i])
        name = f"{key}.{entry.image_exts[i]}"
        if not start <= image - 512 <= image + size <= end:
            raise ShardError(
                f"shard {shard}: the index's offsets of sample {i} ({name!r}) are out of order; "
                "the index is corrupt, re-create it with `gpufeed pack` (or `gpufeed index`)"
            )
        buf = fileobj.read(end - start)
        if len(buf) != end - start:
            raise ShardError(
                f"shard {shard} is truncated inside sample {i} ({key!r}); "
                f"the index lists {entry.samples} samples"
            )
        members = _members(buf, start, shard, last)  # every member checked
        if last and fileobj.read(1):
            raise ShardError(
                f"shard {shard} is longer than the {entry.bytes} bytes the index says: it was "
                "changed after packing; re-create it with `gpufeed pack`"
            )
        found, parts = None, {}
        for member, at, data in members:
            if at == image:
                found = (member, len(data), data)
                continue
            k, ext = (key, member[len(key) + 1 :].lower())  # as split_name, without its cost
            if not member.startswith(key + ".") or "/" in ext:
                k, ext = split_name(member)
            if k == key:
                parts.setdefault(ext, data)
        if found is None:
            raise ShardError(
                f"shard {shard}: no member starts where the index puts {name!r}; the index "
                "does not belong to this shard"
            )
        _check_agrees(found[0], found[1], name, size, shard)
        yield key, found[2], parts


def _members(buf: bytes, start: int, shard: str, last: bool) -> list[Member]:
    """The regular-file members in `buf` (a sample's whole members from shard byte `start`;
    with `last`, then the end-of-archive marker and zeros only), each checked as
    `shards._check_members` checks them: plain headers (and pax headers that only set times or
    owners) here, anything else (long names, other pax records, links) by it and tarfile."""
    out: list[Member] = []
    q = 0
    while q < len(buf):
        block = buf[q : q + 512]
        if last and not block.strip(b"\0"):  # the end-of-archive marker: zeros to the end
            if buf[q:].strip(b"\0"):
                raise ShardError(
                    f"shard {shard}: data after the end-of-archive marker; the shard is corrupt"
                )
            return out
        after_pax = _harmless_pax(buf, q)  # times or owners only (webdataset writes them)
        if after_pax is not None:
            q = after_pax
            continue
        plain = _check_regular_header(block, shard)  # its name, and not a pickle
        if plain is None:
            _check_members(buf, shard, end=last)
            return _members_by_tarfile(buf, start, shard)
        member, size = plain
        out.append((member, start + q + 512, buf[q + 512 : q + 512 + size]))
        q += 512 + _padded(size)
    if q != len(buf):
        raise ShardError(
            f"shard {shard}: a member runs past where the index puts the next sample (or the "
            "shard's end); the shard is corrupt or the index does not belong to it"
        )
    return out


def _members_by_tarfile(buf: bytes, start: int, shard: str) -> list[Member]:
    out: list[Member] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(buf + b"\0" * 1024), mode="r:") as tar:
            for info in tar:
                f = tar.extractfile(info) if info.isfile() else None
                if f is not None:
                    out.append((info.name, start + info.offset_data, f.read()))
    except tarfile.TarError as e:
        raise ShardError(f"shard {shard}: invalid tar headers in a sample ({e})") from e
    return out
