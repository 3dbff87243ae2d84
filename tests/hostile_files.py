"""Hostile files built in code for the CLI tests (tests/cli/): a PNG whose header claims any size."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims width x height (PIL reads the header only before the pixel limit applies)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b""))
    return path
