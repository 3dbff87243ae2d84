"""Verdicts within the instruction-set spread of their threshold: ``measure_spread`` and ``FigureSpread``, the
one definition used by the pipeline's quantize check (``[isa] spread`` in the pipeline file) and by the gate's
``isa.spread`` check; ``check_pin_loads``: whether ``session.x64quantprecision=1`` can load the model at all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qconsist.compare.kinds import JudgedOutput
from qconsist.compare.output import compare_outputs
from qconsist.cpu import instruction_set
from qconsist.emulation import NATIVE
from qconsist.errors import QconsistError, RunStoreError
from qconsist.inference.emulated import outputs_under
from qconsist.inference.session import MEASUREMENT, ExecutionOptions, create_session, outputs_of
from qconsist.inputs.inputset import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.run import Run


PIN = {"session.x64quantprecision": "1"}  # exact integer kernels on every x86 processor (docs/numerics.md)


@dataclass(frozen=True)
class FigureSpread:
    """One figure (an output's SQNR against the float model, top-1 agreement) measured under several instruction
    sets, and its threshold.

    The verdict sits **within the instruction-set spread of its threshold** when the figures differ between
    instruction sets (``spread`` > 0) and the figure measured here (the first instruction set, native) lies no
    farther from the threshold than that spread: the verdicts disagree between the instruction sets measured, or
    agree by a margin smaller than what the instruction set alone moves the figure, so another processor can
    flip it. Such a verdict is a FAIL, in the pipeline's quantize check as in the gate's ``isa.spread``: a
    verdict that depends on the machine the pool picked is not the model's.
    """

    label: str  # "save_infer_model/scale_0.tmp_1 SQNR", "top-1 agreement"
    values: dict[str, float]  # instruction set (native first) -> figure
    threshold: float
    unit: str  # " dB" or "%" (a fraction shown as a percentage)
    higher_is_better: bool = True

    @property
    def here(self) -> float:
        return next(iter(self.values.values()))

    @property
    def spread(self) -> float:
        return max(self.values.values()) - min(self.values.values())

    @property
    def within(self) -> bool:
        return self.spread > 0 and abs(self.here - self.threshold) <= self.spread

    def _show(self, value: float) -> str:
        return f"{value:.1%}" if self.unit == "%" else f"{value:.2f}{self.unit}"

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    def describe(self) -> str:
        """``SQNR 14.8 dB vs floor 15 dB, within the instruction-set spread 0.4 dB (native AVX-512 VNNI 14.8 dB,
        Haswell 15.2 dB): the verdict can flip on another CPU``."""
        kind = "floor" if self.higher_is_better else "limit"
        measured = ", ".join(f"{isa} {self._show(v)}" for isa, v in self.values.items())
        spread = f"{self.spread * 100:.3g} points" if self.unit == "%" else f"{self.spread:.2f}{self.unit}"
        threshold = self._show(self.threshold) if self.unit == "%" else f"{self.threshold:g}{self.unit}"
        head = f"{self.label} {self._show(self.here)} vs {kind} {threshold}"
        if self.within:
            flips = {"passes" if self.passes(v) else "fails" for v in self.values.values()}
            how = "the verdicts differ between them" if len(flips) > 1 else "the verdict can flip on another CPU"
            return f"{head}, within the instruction-set spread {spread} ({measured}): {how}"
        return f"{head}, outside the instruction-set spread {spread} ({measured})"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "values": dict(self.values), "threshold": self.threshold, "unit": self.unit,
                "higher_is_better": self.higher_is_better, "spread": self.spread, "within": self.within}


class PinLoadError(QconsistError):
    """onnxruntime cannot create a session for the model under the pinned integer path."""


@dataclass
class IsaSpread:
    """A quantized model's outputs under each instruction set (``outputs_under``), compared with the float
    model's native outputs, the figures' spreads against their thresholds, and whether the outputs are
    bit-identical to native."""

    instruction_sets: list[str]
    pinned: bool
    samples: int
    figures: list[FigureSpread]
    identical: dict[str, bool]  # emulated instruction set -> outputs bit-identical to native

    @property
    def within(self) -> list[FigureSpread]:
        return [f for f in self.figures if f.within]

    @property
    def differing(self) -> list[str]:
        return [isa for isa, same in self.identical.items() if not same]

    def to_json(self) -> dict[str, Any]:
        return {"instruction_sets": list(self.instruction_sets), "pinned": self.pinned, "samples": self.samples,
                "figures": [f.to_json() for f in self.figures], "identical": dict(self.identical),
                "passed": not self.within}


def isa_name(isa: str) -> str:
    """``native AVX-512 VNNI`` for this processor, the QEMU model's name for an emulated one."""
    return f"native {instruction_set().kernels}" if isa == NATIVE else isa


def pinned_options(pin: bool) -> ExecutionOptions:
    return MEASUREMENT.with_options(session_config=PIN) if pin else MEASUREMENT


def check_pin_loads(model: Path) -> None:
    """``PinLoadError`` (one line, onnxruntime's words) when the pinned session cannot be created here: with
    onnxruntime 1.31/1.32, ``session.x64quantprecision=1`` fails on a QDQ model where one int8 constant feeds
    several nodes ("AddInitializedOrtValue Attempt to replace the existing tensor", docs/numerics.md)."""
    try:
        create_session(model, pinned_options(True))
    except QconsistError as exc:
        raise PinLoadError(f"session.x64quantprecision=1 cannot load the quantized model: {pin_failure(exc)}") from None


def pin_failure(exc: QconsistError) -> str:
    """onnxruntime's reason, without the model's path: ``onnxruntime 1.31.1: … Attempt to replace the existing
    tensor``."""
    import onnxruntime as ort

    text = str(exc.message if hasattr(exc, "message") else exc)
    reason = text.split(": ", 1)[1] if text.startswith("onnxruntime ") and ": " in text else text
    return f"onnxruntime {ort.__version__}: {reason}"


def measure_spread(float_model: Path, quantized: Path, inputs: InputSet, judged: Sequence[JudgedOutput],
                   isas: Sequence[str], *, pin: bool, min_sqnr_db: float | None,
                   min_top1_agreement: float | None = None, reference: list[dict[str, np.ndarray]] | None = None,
                   progress: Progress = NULL_PROGRESS) -> IsaSpread:
    """The quantized model's outputs on ``inputs`` under ``native`` and each of ``isas`` (resolved QEMU models),
    judged against the float model's native outputs; ``PinLoadError`` when ``pin`` and the pinned session
    cannot be created."""
    order = tuple(dict.fromkeys((NATIVE, *isas)))
    if pin:
        check_pin_loads(quantized)
    options = pinned_options(pin)
    reference = reference if reference is not None else outputs_of(float_model, inputs)
    outputs: dict[str, list[dict[str, np.ndarray]]] = {}
    with progress.task(f"outputs under {', '.join(order)} (emulation is slow)", len(order)) as task:
        for isa in order:
            outputs[isa] = outputs_under(isa, quantized, inputs, options)
            task.advance()
    comparisons = {isa: compare_outputs(reference, got, None, None, judged) for isa, got in outputs.items()}
    figures: list[FigureSpread] = []
    for judgement in comparisons[NATIVE].judgements:
        if judgement.integer or min_sqnr_db is None:
            continue
        values = {isa_name(isa): float(next(j.sqnr_db for j in comparisons[isa].judgements if j.label == judgement.label))
                  for isa in order}
        figures.append(FigureSpread(f"{judgement.label} SQNR", values, float(min_sqnr_db), " dB"))
    top1 = {isa_name(isa): c.top1_agreement for isa, c in comparisons.items()}
    if min_top1_agreement is not None and all(v is not None for v in top1.values()):
        figures.append(FigureSpread("top-1 agreement", {k: float(v) for k, v in top1.items() if v is not None},
                                    float(min_top1_agreement), "%"))
    identical = {isa: _identical(outputs[NATIVE], outputs[isa]) for isa in order[1:]}
    return IsaSpread(list(order), pin, len(inputs), figures, identical)


def _identical(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


# --- a `locate --ep cpu` record (run directory of kind "locate-cpu", written by qconsist.locate.isa) as evidence --

RECORD_KIND = "locate-cpu"
RECORD_SECTION = "locate_cpu"
SETTING_OF = {False: "default", True: "x64quantprecision"}  # [isa] pin -> the locate setting it runs


@dataclass(frozen=True)
class RecordedIsas:
    """What a ``locate --ep cpu`` record says of one setting of a model (found by its md5)."""

    path: Path
    setting: str
    instruction_sets: tuple[str, ...]
    identical: bool  # final outputs bit-identical on every instruction set of the record
    load_error: str | None = None
    differing: tuple[str, ...] = ()  # "Haswell (up to 0.00784)"

    def covers(self, isas: Sequence[str]) -> bool:
        return {i.lower() for i in isas} <= {i.lower() for i in self.instruction_sets}

    def describe(self) -> str:
        where = f"locate --ep cpu record {self.path}"
        if self.load_error:
            return f"{where}: cannot load under this setting: {self.load_error}"
        if self.identical:
            return f"{where}: final outputs bit-identical on {', '.join(self.instruction_sets)}"
        return f"{where}: final outputs differ from native on {', '.join(self.differing)}"


def find_cpu_locate(runs_root: Path, md5: str, pin: bool) -> RecordedIsas | None:
    """The newest complete ``locate-cpu`` run under ``runs_root`` whose model has ``md5``, read for the setting
    ``pin`` runs (``None``: there is none, or it did not measure that setting)."""
    found: list[tuple[str, Path, dict[str, Any]]] = []
    root = Path(runs_root)
    if not root.is_dir():
        return None
    for path in root.iterdir():
        if not (path / "manifest.json").is_file():
            continue
        try:
            run = Run.open(path)
        except (RunStoreError, QconsistError):
            continue
        section = run.manifest.sections.get(RECORD_SECTION)
        if run.kind != RECORD_KIND or run.manifest.model.get("md5") != md5 or not isinstance(section, dict):
            continue
        found.append((str(run.manifest.started or ""), path, section))
    if not found:
        return None
    _, path, section = max(found, key=lambda item: item[0])
    setting = SETTING_OF[pin]
    cells = [c for c in section.get("cells") or () if isinstance(c, dict) and c.get("setting") == setting]
    if not cells:
        return None
    isas = tuple(dict.fromkeys(str(c.get("isa")) for c in cells))
    error = (section.get("cannot_load") or {}).get(setting)
    differing = tuple(f"{c.get('isa')} (up to {float(c.get('greatest_abs') or 0):.3g})" for c in cells
                      if c.get("identical_to_native") is False and not c.get("load_error"))
    identical = bool((section.get("identical") or {}).get(setting)) and not error
    return RecordedIsas(path, setting, isas, identical, error, differing)
