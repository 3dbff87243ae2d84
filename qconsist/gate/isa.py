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

What "within the spread" means is defined once, in ``qconsist.pipeline.isaspread`` (``FigureSpread.within``), and the
pipeline's quantize check uses the same definition. A pin onnxruntime cannot load (``PinLoadError``) fails the
check with onnxruntime's one line. A ``locate --ep cpu`` record of the quantized model (a ``locate-cpu`` run
beside the candidate's pipeline run, found by the model's md5) that found the setting's final outputs
bit-identical on every instruction set of the policy is the evidence instead of emulating again.
"""

from __future__ import annotations

from typing import Any

from qconsist.emulation import NATIVE, parse_models
from qconsist.gate.evidence import Side, evaluation_inputs
from qconsist.gate.policy import Policy
from qconsist.gate.verdict import CheckResult, CheckStatus
from qconsist.pipeline.isaspread import PIN, PinLoadError, check_pin_loads, find_cpu_locate, measure_spread  # noqa: F401
from qconsist.store.hashing import hash_file

PASS, FAIL, NA = CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.NOT_APPLICABLE


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
    pinned = "with session.x64quantprecision=1" if policy.isa.pin else "with onnxruntime's default integer path"
    md5 = hash_file(quantized).md5
    record = find_cpu_locate(candidate.pipeline_path.parent, md5, policy.isa.pin)
    if record is not None and record.identical and record.covers(isas):
        try:
            if policy.isa.pin:
                check_pin_loads(quantized)
        except PinLoadError as exc:
            return CheckResult("isa.spread", FAIL, f"[isa] pin: {exc}", tolerance, {"pin_error": str(exc)})
        return CheckResult("isa.spread", PASS, f"drift.float's verdict holds on {', '.join(isas)}: {pinned}, "
                           f"{record.describe()} (model md5 {md5}): the figures cannot differ between them",
                           tolerance, {"record": str(record.path), "setting": record.setting,
                                       "instruction_sets": list(record.instruction_sets), "identical": True})
    inputs = evaluation_inputs(candidate)
    try:
        spread = measure_spread(candidate.artifact(float_stage), quantized, inputs, candidate.judged(), isas[1:],
                                pin=policy.isa.pin, min_sqnr_db=limits.min_sqnr_db,
                                min_top1_agreement=limits.min_top1_agreement, reference=candidate.outputs(float_stage))
    except PinLoadError as exc:
        return CheckResult("isa.spread", FAIL, f"[isa] pin: {exc}", tolerance, {"pin_error": str(exc)})
    measured: dict[str, Any] = spread.to_json()
    problems = [figure.describe() for figure in spread.within]
    identity = (f"outputs bit-identical to native on {', '.join(isas[1:])}" if not spread.differing else
                f"outputs differ from native on {', '.join(spread.differing)}")
    if policy.isa.pin and spread.differing:
        problems.append(f"[isa] pin requires outputs bit-identical across instruction sets, but they differ "
                        f"on {', '.join(spread.differing)} even {pinned}")
    text = f"{pinned}, {len(inputs)} evaluation samples: {identity}; " + "; ".join(f.describe() for f in spread.figures)
    if problems:
        advice = "" if policy.isa.pin else "; [isa] pin = true (session.x64quantprecision=1) makes the integer path the same on every x86 processor"
        return CheckResult("isa.spread", FAIL, f"the verdict depends on the instruction set: {'; '.join(problems)}{advice}; {text}",
                           tolerance, measured)
    return CheckResult("isa.spread", PASS, f"drift.float's verdict holds on {', '.join(isas)}: {text}", tolerance, measured)
