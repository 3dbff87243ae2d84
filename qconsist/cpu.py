"""The processor's instruction set as onnxruntime's CPU kernels see it, and the integer GEMM path it implies.

onnxruntime's MLAS chooses its kernels once per process from ``cpuid`` and ``xgetbv``
(``onnxruntime/core/mlas/lib/platform.cpp``, ``MLAS_PLATFORM::MLAS_PLATFORM``): SSE2/SSE4.1 by default, AVX,
then AVX2 + FMA3, AVX-VNNI, AVX-512 F, AVX-512 Core (BW, DQ, VL), AVX-512 VNNI, AVX-VNNI-INT8 and AMX. The
u8·s8 matrix product (every QLinearConv / QGemm / MatMulInteger of a QDQ model with int8 weights) runs:

- on AVX2 and AVX-512 Core without VNNI, through ``VPMADDUBSW``, which sums pairs of u8·s8 products in
  **saturating 16-bit** arithmetic (255·127·2 = 64,770 is clamped to 32,767): the result depends on the data;
- on AVX-VNNI, AVX-512 VNNI and AMX through ``VPDPBUSD`` / tile products summed in 32 bits: exact;
- on a processor without AVX2 (Linux build), through the SSE2 u8·x8 kernel, which widens to 16 bits first
  and sums with ``PMADDWD``: exact.

``session.x64quantprecision=1`` (``kOrtSessionOptionsAvx2PrecisionMode``) adds the ``Avx2WeightS8ToU8Transformer``
where ``MlasPlatformU8S8Overflow()`` (the u8·u8 and u8·s8 dispatches differ: every processor with AVX2) and so
runs the exact u8·u8 kernels instead: the same integers on every processor, at a cost measured by
``qconsist locate --ep cpu``.

The features are read with the ``cpuid`` instruction itself (a few bytes of machine code run through ctypes),
so that a process under QEMU user mode sees the emulated processor — its ``/proc/cpuinfo`` shows the host's —
and from ``/proc/cpuinfo``'s flags where the code cannot run.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# What MLAS reads, in the order it reads it: (name recorded, /proc/cpuinfo flag).
FEATURES = (
    ("sse4_1", "sse4_1"), ("sse4_2", "sse4_2"), ("avx", "avx"), ("fma", "fma"), ("avx2", "avx2"),
    ("avx_vnni", "avx_vnni"), ("avx512f", "avx512f"), ("avx512dq", "avx512dq"), ("avx512bw", "avx512bw"),
    ("avx512vl", "avx512vl"), ("avx512_vnni", "avx512_vnni"), ("avx_vnni_int8", "avx_vnni_int8"),
    ("amx_tile", "amx_tile"), ("amx_int8", "amx_int8"),
)

# Set by ``qconsist.emulation`` in the child it starts under QEMU: the CPU model emulated (``Haswell``) and
# QEMU's version, recorded beside the features the child's ``cpuid`` reads.
EMULATED_ENV = "QCONSIST_EMULATED_CPU"
QEMU_VERSION_ENV = "QCONSIST_QEMU_VERSION"

# x86-64 System V machine code. cpuid(leaf=edi, subleaf=esi, out=rdx): the four registers into out[0..3].
_CPUID_CODE = bytes.fromhex("53" "89f8" "89f1" "4989d0" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")
# xgetbv(ecx=edi) -> edx:eax in rax
_XGETBV_CODE = bytes.fromhex("89f9" "0f01d0" "48c1e220" "4809d0" "c3")


class _Cpuid:
    """``cpuid`` and ``xgetbv`` run as machine code from an executable page (kept for the process)."""

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._page.write(_CPUID_CODE + b"\x90" * (64 - len(_CPUID_CODE)) + _XGETBV_CODE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32 * 4))(base)
        self._xgetbv = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32)(base + 64)

    def __call__(self, leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        out = (ctypes.c_uint32 * 4)()
        self._cpuid(leaf, subleaf, ctypes.byref(out))
        return out[0], out[1], out[2], out[3]

    def xgetbv(self, register: int = 0) -> int:
        return int(self._xgetbv(register))


def _bit(value: int, bit: int) -> bool:
    return bool(value >> bit & 1)


def _from_cpuid() -> tuple[str, str, dict[str, bool]]:
    """Vendor, brand string and the features MLAS tests, as MLAS tests them (the OS's saved state included)."""
    cpuid = _Cpuid()
    top, ebx, ecx, edx = cpuid(0)
    vendor = b"".join(r.to_bytes(4, "little") for r in (ebx, edx, ecx)).decode("ascii", "replace")
    brand = ""
    if cpuid(0x80000000)[0] >= 0x80000004:
        brand = b"".join(r.to_bytes(4, "little") for leaf in (0x80000002, 0x80000003, 0x80000004)
                         for r in cpuid(leaf)).split(b"\0")[0].decode("ascii", "replace").strip()
    _, _, ecx1, _ = cpuid(1)
    xcr0 = cpuid.xgetbv(0) if _bit(ecx1, 27) else 0
    ebx7 = ecx7 = edx7 = eax71 = edx71 = 0
    if top >= 7:
        _, ebx7, ecx7, edx7 = cpuid(7, 0)
        eax71, _, _, edx71 = cpuid(7, 1)
    avx_state = (xcr0 & 0x6) == 0x6
    avx512_state = avx_state and (xcr0 & 0xE0) == 0xE0
    tile_state = (xcr0 & 0x60000) == 0x60000
    features = {
        "sse4_1": _bit(ecx1, 19), "sse4_2": _bit(ecx1, 20),
        "avx": _bit(ecx1, 28) and avx_state, "fma": _bit(ecx1, 12) and avx_state,
        "avx2": _bit(ebx7, 5) and avx_state, "avx_vnni": _bit(eax71, 4) and avx_state,
        "avx512f": _bit(ebx7, 16) and avx512_state, "avx512dq": _bit(ebx7, 17) and avx512_state,
        "avx512bw": _bit(ebx7, 30) and avx512_state, "avx512vl": _bit(ebx7, 31) and avx512_state,
        "avx512_vnni": _bit(ecx7, 11) and avx512_state, "avx_vnni_int8": _bit(edx71, 4) and avx_state,
        "amx_tile": _bit(edx7, 24) and tile_state, "amx_int8": _bit(edx7, 25) and tile_state,
    }
    return vendor, brand, features


def _from_proc() -> tuple[str, str, dict[str, bool]]:
    vendor = brand = ""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "model name" and not brand:
                    brand = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return vendor, brand or platform.processor(), {name: flag in flags for name, flag in FEATURES}


@dataclass(frozen=True)
class InstructionSet:
    """The processor as onnxruntime's CPU kernels see it. ``kernels`` names the u8·s8 kernel family MLAS
    chooses ("AVX-512 VNNI", "AVX2 without VNNI", …); ``saturates`` is true where that kernel sums u8·s8
    pairs in saturating 16-bit arithmetic (the overflow risk ``session.x64quantprecision`` removes);
    ``precision_pin_applies`` where that option changes the graph (``MlasPlatformU8S8Overflow``)."""

    vendor: str
    model: str
    features: tuple[str, ...]  # the FEATURES present, in FEATURES' order
    source: str  # "cpuid" or "/proc/cpuinfo"
    emulated: str | None = None  # the QEMU CPU model this process runs under, None when native
    qemu: str | None = None  # QEMU's version when emulated

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def kernels(self) -> str:
        """The u8·s8 GEMM kernel family MLAS dispatches to (platform.cpp's order: later tests override)."""
        if not self.has("avx2") or not self.has("fma"):
            return "SSE (no AVX2)"
        name = "AVX2 without VNNI"
        if self.has("avx_vnni"):
            name = "AVX-VNNI"
        if self.has("avx512f") and all(self.has(f) for f in ("avx512bw", "avx512dq", "avx512vl")):
            name = "AVX-512 VNNI" if self.has("avx512_vnni") else "AVX-512 Core without VNNI"
        if self.has("amx_tile") and self.has("amx_int8"):
            name = "AMX"
        return name

    @property
    def saturates(self) -> bool:
        return self.kernels in ("AVX2 without VNNI", "AVX-512 Core without VNNI")

    @property
    def precision_pin_applies(self) -> bool:
        return self.has("avx2") and self.has("fma")

    @property
    def float_kernels(self) -> str:
        """The float GEMM / convolution kernel family (and NCHWc block): FMA3 vs AVX-512F round differently."""
        if self.has("avx512f"):
            return "AVX-512F (NCHWc 16)"
        if self.has("avx2") and self.has("fma"):
            return "FMA3 (NCHWc 8)"
        if self.has("avx"):
            return "AVX (NCHWc 8)"
        return "SSE (NCHWc 8)"

    @property
    def integer_path(self) -> str:
        """The u8·s8 path in words: which instruction sums the products and whether it can saturate."""
        if self.kernels == "SSE (no AVX2)":
            return "u8·s8 widened to 16 bits and summed with PMADDWD: exact (session.x64quantprecision has no effect)"
        if self.saturates:
            return ("u8·s8 pairs summed with VPMADDUBSW in saturating 16-bit arithmetic: can overflow "
                    "(session.x64quantprecision=1 runs exact u8·u8 instead)")
        instruction = "AMX tiles" if self.kernels == "AMX" else "VPDPBUSD"
        return f"u8·s8 summed in 32 bits with {instruction}: exact"

    def describe(self) -> str:
        where = f"emulated {self.emulated} under QEMU {self.qemu or ''}".rstrip() if self.emulated else "native"
        return f"{self.kernels} ({where}; {self.model or self.vendor or 'unknown processor'})"

    def to_json(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor, "model": self.model, "features": list(self.features), "source": self.source,
            "emulated": self.emulated, "qemu": self.qemu, "kernels": self.kernels,
            "integer_path": self.integer_path, "saturates": self.saturates, "float_kernels": self.float_kernels,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "InstructionSet":
        return cls(str(data.get("vendor") or ""), str(data.get("model") or ""), tuple(data.get("features") or ()),
                   str(data.get("source") or ""), data.get("emulated"), data.get("qemu"))


@lru_cache(maxsize=1)
def instruction_set() -> InstructionSet:
    """This process's instruction set: ``cpuid`` on x86-64 (what MLAS reads, emulated or not), else
    ``/proc/cpuinfo``; the QEMU CPU model when ``qconsist.emulation`` started this process."""
    vendor = brand = ""
    features: dict[str, bool] = {}
    source = "cpuid"
    if platform.machine().lower() in ("x86_64", "amd64"):
        try:
            vendor, brand, features = _from_cpuid()
        except (OSError, ValueError, AttributeError):  # no executable page (a hardened kernel)
            source = ""
    if not features:
        vendor, brand, features = _from_proc()
        source = "/proc/cpuinfo"
    present = tuple(name for name, _ in FEATURES if features.get(name))
    return InstructionSet(vendor, brand, present, source, os.environ.get(EMULATED_ENV) or None,
                          os.environ.get(QEMU_VERSION_ENV) or None)
