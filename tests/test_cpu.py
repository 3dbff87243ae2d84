"""The instruction set as onnxruntime's MLAS sees it: read with cpuid, named by the kernels it implies."""

from __future__ import annotations

import pytest

from qconsist.cpu import FEATURES, InstructionSet, _from_proc, instruction_set
from qconsist.environment import compare_environments, describe_changes, fingerprint, instruction_set_change

HASWELL = ("sse4_1", "sse4_2", "avx", "fma", "avx2")
SKYLAKE_SP = (*HASWELL, "avx512f", "avx512dq", "avx512bw", "avx512vl")
CASCADE_LAKE = (*SKYLAKE_SP, "avx512_vnni")
SAPPHIRE_RAPIDS = (*CASCADE_LAKE, "avx_vnni", "amx_tile", "amx_int8")
ALDER_LAKE = (*HASWELL, "avx_vnni")
NEHALEM = ("sse4_1", "sse4_2")


@pytest.mark.parametrize(("features", "kernels", "saturates", "pin", "floats"), [
    (HASWELL, "AVX2 without VNNI", True, True, "FMA3 (NCHWc 8)"),
    (SKYLAKE_SP, "AVX-512 Core without VNNI", True, True, "AVX-512F (NCHWc 16)"),
    (CASCADE_LAKE, "AVX-512 VNNI", False, True, "AVX-512F (NCHWc 16)"),
    (SAPPHIRE_RAPIDS, "AMX", False, True, "AVX-512F (NCHWc 16)"),
    (ALDER_LAKE, "AVX-VNNI", False, True, "FMA3 (NCHWc 8)"),
    (NEHALEM, "SSE (no AVX2)", False, False, "SSE (NCHWc 8)"),
])
def test_the_kernels_follow_platform_cpp(features, kernels, saturates, pin, floats):
    isa = InstructionSet("GenuineIntel", "test", features, "cpuid")
    assert (isa.kernels, isa.saturates, isa.precision_pin_applies, isa.float_kernels) == (kernels, saturates, pin, floats)
    assert ("can overflow" in isa.integer_path) is saturates
    assert InstructionSet.from_json(isa.to_json()) == isa


def test_cpuid_agrees_with_the_kernels_flags_here():
    """Natively, what cpuid reads is what the kernel's /proc/cpuinfo says (under QEMU only cpuid is right)."""
    isa = instruction_set()
    _, model, flags = _from_proc()
    assert isa.source == "cpuid" and isa.emulated is None
    assert set(isa.features) == {name for name, _ in FEATURES if flags[name]}
    assert isa.model == model


def test_the_fingerprint_records_it_and_a_change_is_named():
    fp = fingerprint()
    assert fp["cpu_isa"]["kernels"] == instruction_set().kernels
    haswell = {**fp, "cpu_isa": InstructionSet("GenuineIntel", "Intel Core Processor (Haswell)", HASWELL, "cpuid",
                                               "Haswell", "7.2.22").to_json()}
    cascade = {**fp, "cpu_isa": InstructionSet("GenuineIntel", "Xeon", CASCADE_LAKE, "cpuid").to_json()}
    line = ("ran different CPU kernels: AVX2 without VNNI vs AVX-512 VNNI (float FMA3 (NCHWc 8) vs AVX-512F "
            "(NCHWc 16); emulated Haswell vs native Xeon)")
    assert instruction_set_change(haswell, cascade) == line
    assert describe_changes(haswell, cascade)[0] == line  # history's and the nightly's "what changed"
    diff = compare_environments(haswell, cascade)
    assert [str(c) for c in diff.numerics] == [
        "instruction set (CPU kernels): AVX2 without VNNI, float FMA3 (NCHWc 8) -> AVX-512 VNNI, float AVX-512F (NCHWc 16)"]
    assert diff.kernels is not None
    # a run recorded before the instruction set was: unknown, not a change
    old = {k: v for k, v in cascade.items() if k != "cpu_isa"}
    assert compare_environments(old, cascade).numerics == () and instruction_set_change(old, cascade) is None
