"""Read indexed samples whole: the image and every other member of the sample (`.cls`, `.json`,
`.txt`), for a Loader asked for `extras` (`gpufeed.data.sample_extras`).

`shards.read_indexed` reads only up to each image: the members a WebDataset sample has after its
image (gpufeed writes `.cls` after `.jpg`; webdataset writes members in sorted order, so `.json`
and `.txt` come after `.jpg`) are never read. Here each sample is read from its first header to
the next sample's (`offsets[i]`..`offsets[i + 1]`; the last one to the shard's end) and walked by
`gpufeed.data.tar_scan`, with the rules every read and `gpufeed index` apply: every member header
checked (regular files only, no escaping names, nothing that could be unpickled), the image where
the index puts it, and after the last sample tar's end-of-archive marker up to exactly the shard's
size (so a reader from byte 0 can verify the checksum).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from gpufeed.data.index_file import ShardEntry
from gpufeed.data.shards import ShardError, _check_agrees, _no_header
from gpufeed.data.tar_scan import BLOCK, BadHeader, Tape, members, split_name


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
        if not start <= image - BLOCK <= image + size <= end:
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
        found, parts = None, {}
        try:  # every member checked, its data read
            for member, data in members(Tape(shard, buf, start, entry.bytes), start, end, end=last):
                if member.data == image:
                    found = (member.name, member.size, data)
                    continue
                k, ext = key, member.name[len(key) + 1 :].lower()  # as split_name, without its cost
                if not member.name.startswith(key + ".") or "/" in ext:
                    k, ext = split_name(member.name)
                if k == key:
                    parts.setdefault(ext, data)
        except BadHeader as e:
            raise _no_header(shard, e, start if i == first else -1, image, i, name) from None
        if last and fileobj.read(1):
            raise ShardError(
                f"shard {shard} is longer than the {entry.bytes} bytes the index says: it was "
                "changed after packing; re-create it with `gpufeed pack`"
            )
        if found is None:
            raise ShardError(
                f"shard {shard}: no member starts where the index puts {name!r}; the index "
                "does not belong to this shard"
            )
        _check_agrees(found[0], found[1], name, size, shard)
        yield key, found[2] or b"", parts
