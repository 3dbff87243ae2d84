"""qc-mix64/1 written from its definition (qconsist/inference/kernels.py) in plain Python: the tests' oracle."""

from __future__ import annotations

MASK = (1 << 64) - 1


def fmix64(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def reference_mix64(data: bytes) -> int:
    total = 0
    for i in range(0, len(data), 8):
        word = int.from_bytes(data[i:i + 8].ljust(8, b"\0"), "little")
        total = (total + fmix64(word ^ (((i // 8 + 1) * 0x9E3779B97F4A7C15) & MASK))) & MASK
    return fmix64(total ^ ((len(data) * 0xC2B2AE3D27D4EB4F) & MASK))
