"""Crafted images for the decompression-bomb tests."""

from __future__ import annotations

import struct

import numpy as np
import simplejpeg


def jpeg_claiming(height: int, width: int) -> bytes:
    """A tiny valid JPEG whose SOF header is patched to claim height × width pixels."""
    data = bytearray(simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8), quality=50))
    i = 2
    while data[i + 1] not in (0xC0, 0xC1, 0xC2):  # walk the marker segments to the frame header
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    data[i + 5 : i + 9] = struct.pack(">HH", height, width)
    return bytes(data)


# --- crafted tars: headers written byte by byte, as no well-behaved writer would -------------------

BLOCK = 512


def tar_header(
    name: str,
    size: int = 0,
    kind: bytes = b"0",
    *,
    size_field: bytes | None = None,
    fields: dict[int, bytes] | None = None,
) -> bytes:
    """One GNU-format tar header block with a valid checksum: `kind` is the type flag,
    `size_field` (12 bytes) replaces the octal size (e.g. `base256(...)`), `fields` puts other
    bytes at their offsets (e.g. a sparse map)."""
    h = bytearray(BLOCK)
    h[0 : len(name)] = name.encode()
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"%011o\0" % 0
    h[156:157] = kind
    h[257:265] = b"ustar  \0"
    for at, value in (fields or {}).items():
        h[at : at + len(value)] = value
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def base256(n: int) -> bytes:
    """A 12-byte GNU base-256 size field for `n`."""
    return b"\x80" + n.to_bytes(11, "big")


def tar_member(name: str, data: bytes, kind: bytes = b"0") -> bytes:
    """A member: its header, then its data padded to whole blocks."""
    return tar_header(name, len(data), kind) + data + b"\0" * (-len(data) % BLOCK)


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    """A whole tar of regular members, ending as tarfile ends one (two zero blocks, then padding
    to a 10 KiB record)."""
    body = b"".join(tar_member(n, d) for n, d in members) + b"\0" * (2 * BLOCK)
    return body + b"\0" * (-len(body) % (20 * BLOCK))


def sparse_member(name: str, data: bytes, hole: int = 8192) -> bytes:
    """A GNU sparse member ('S'): `data` stored, then a hole of `hole` bytes in the real file."""
    sparse_map = b"%011o\0" % 0 + b"%011o\0" % len(data)  # one (offset, length) entry at 386
    real = b"%011o\0" % (len(data) + hole)
    header = tar_header(name, len(data), b"S", fields={386: sparse_map, 483: real})
    return header + data + b"\0" * (-len(data) % BLOCK)
