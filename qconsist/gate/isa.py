"""The gate's check ``isa.spread``: does drift.float's verdict hold on every instruction set of the policy?

The same quantized model computes other integers on another processor (``qconsist.cpu``: AVX2 without VNNI
saturates its u8·s8 sums, VNNI does not), so a figure measured on one machine — an output's SQNR against the
float model, top-1 agreement — moves by a little on another, and a verdict close to its threshold flips with
the machine of the pool it ran on. With ``[isa] spread = ["Haswell", …]`` the gate computes the candidate's
quantized outputs on the evaluation inputs also under each of those QEMU CPU models (``qconsist.inference.
emulated``), judges every one against the same native float reference with drift.float's limits, and fails
when a threshold lies within the figures' spread (the verdicts disagree, or the margin is smaller than the
spread): the verdict depends on the instruction set, by that much. ``[isa] pin = true`` computes those
outputs with ``session.x64quantprecision=1`` and requires them bit-identical across the instruction sets.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qconsist.compare.output import compare_outputs
from qconsist.emulation import NATIVE, parse_models
from qconsist.gate.evidence import Side, evaluation_inputs
from qconsist.gate.policy import Policy
from qconsist.gate.verdict import CheckResult, CheckStatus
from qconsist.inference.emulated import outputs_under
from qconsist.inference.session import MEASUREMENT

PIN = {"session.x64quantprecision": "1"}
PASS, FAIL, NA = CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.NOT_APPLICABLE


def _identical(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def check_isa_spread(candidate: Side, policy: Policy) -> CheckResult:
    limits = policy.drift.float
    tolerance: dict[str, Any] = {"spread": list(policy.isa.spread), "pin": policy.isa.pin,
                                 "min_sqnr_db": limits.min_sqnr_db, "min_top1_agreement": limits.min_top1_agreement}
    if not policy.isa.spread:
        return CheckResult("isa.spread", NA, "no instruction sets to measure drift.float's spread on "
                           "([isa] spread lists QEMU CPU models, e.g. [\"Haswell\"])", tolerance)
    float_stage = candidate.float_stage()
    quantized = candidate.artifact("quantize")
    if float_stage is None or quantized is None:
        return CheckResult("isa.spread", FAIL, "the run has no float and quantized artifacts to compare", tolerance)
    isas = tuple(dict.fromkeys((NATIVE, *parse_models(list(policy.isa.spread)))))
    options = MEASUREMENT.with_options(session_config=PIN) if policy.isa.pin else MEASUREMENT
    reference = candidate.outputs(float_stage)
    judged = candidate.judged()
    inputs = evaluation_inputs(candidate)
    outputs = {isa: outputs_under(isa, quantized, inputs, options) for isa in isas}
    comparisons = {isa: compare_outputs(reference, got, None, None, judged) for isa, got in outputs.items()}
    measured: dict[str, Any] = {"instruction_sets": list(isas), "figures": {}, "identical": {}}
    problems: list[str] = []
    lines: list[str] = []
    for isa in isas[1:]:
        measured["identical"][isa] = _identical(outputs[NATIVE], outputs[isa])
    # SQNR of every output and part, per instruction set
    labels = [j.label for j in comparisons[NATIVE].judgements if not j.integer]
    for label in labels:
        values = {isa: next(j.sqnr_db for j in comparisons[isa].judgements if j.label == label) for isa in isas}
        measured["figures"][f"{label} sqnr_db"] = values
        low, high = min(values.values()), max(values.values())
        lines.append(f"{label} SQNR " + ", ".join(f"{v:.2f} dB {isa}" for isa, v in values.items())
                     + f" (spread {high - low:.3g} dB)")
        floor = limits.min_sqnr_db
        if floor is not None and high != low and low < floor <= high:
            problems.append(f"{label}: the {floor:g} dB floor lies within the spread {low:.2f}–{high:.2f} dB: "
                            f"passes on {', '.join(i for i, v in values.items() if v >= floor)}, fails on "
                            f"{', '.join(i for i, v in values.items() if v < floor)}")
    top1 = {isa: c.top1_agreement for isa, c in comparisons.items()}
    if all(v is not None for v in top1.values()):
        measured["figures"]["top1_agreement"] = top1
        low, high = min(top1.values()), max(top1.values())  # type: ignore[type-var]
        lines.append("top-1 agreement " + ", ".join(f"{v:.1%} {isa}" for isa, v in top1.items()))
        minimum = limits.min_top1_agreement
        if minimum is not None and low < minimum <= high:
            problems.append(f"top-1 agreement {low:.1%}–{high:.1%} across instruction sets straddles the minimum "
                            f"{minimum:.1%}")
    pinned = "with session.x64quantprecision=1" if policy.isa.pin else "with onnxruntime's default integer path"
    differing = [isa for isa, same in measured["identical"].items() if not same]
    identity = (f"outputs bit-identical to native on {', '.join(isas[1:])}" if not differing else
                f"outputs differ from native on {', '.join(differing)}")
    if policy.isa.pin and differing:
        problems.append(f"[isa] pin requires outputs bit-identical across instruction sets, but they differ "
                        f"on {', '.join(differing)} even {pinned}")
    text = f"{pinned}, {len(inputs)} evaluation samples: {identity}; " + "; ".join(lines)
    if problems:
        advice = "" if policy.isa.pin else "; [isa] pin = true (session.x64quantprecision=1) makes the integer path the same on every x86 processor"
        return CheckResult("isa.spread", FAIL, f"the verdict depends on the instruction set: {'; '.join(problems)}{advice}; {text}",
                           tolerance, measured)
    return CheckResult("isa.spread", PASS, f"drift.float's verdict holds on {', '.join(isas)}: {text}", tolerance, measured)
