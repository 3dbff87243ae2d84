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


# -- .npz archives: one per way an archive lies (issue 29, item 5) --------------------------------------------


def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def npz_archives(folder: Path, name: str = "input", shape: tuple[int, ...] = (4, 3, 8, 8), bomb_mib: int = 868) -> dict[str, Path]:
    """``good`` (one stacked array), ``truncated`` (its first half), ``member`` (an array and a text member),
    ``claims`` (a 1 KB archive whose header claims 768 GiB), ``bomb`` (a 0.8 MB archive whose member inflates to
    ``bomb_mib`` MiB behind a header that claims 3 KB), ``text`` (a CSV named ``.npz``)."""
    import io
    import zipfile

    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    out = {key: folder / f"{key}.npz" for key in ("good", "truncated", "member", "claims", "bomb", "text")}
    array = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.savez(out["good"], **{name: array})
    blob = out["good"].read_bytes()
    out["truncated"].write_bytes(blob[: len(blob) // 2])
    with zipfile.ZipFile(out["member"], "w") as archive:
        buffer = io.BytesIO()
        np.save(buffer, array)
        archive.writestr(f"{name}.npy", buffer.getvalue())
        archive.writestr("notes.txt", "calibration set v2")
    with zipfile.ZipFile(out["claims"], "w") as archive:
        archive.writestr(f"{name}.npy", _npy_header((768 * 2**30 // 4 // 192, 3, 8, 8)) + b"\0" * 512)
    with zipfile.ZipFile(out["bomb"], "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open(f"{name}.npy", "w", force_zip64=True) as handle:
            handle.write(_npy_header(shape))
            block = b"\0" * (1 << 20)
            for _ in range(bomb_mib):
                handle.write(block)
    out["text"].write_text("sample,value\n1,2\n")
    return out
