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
