"""Running a model over an input set and comparing two models' outputs, for the stages' checks.

Sessions are created quietly (log severity 3) on the CPU execution provider with the default graph
optimizations; the comparison is elementwise ``|got - ref| <= atol + rtol * |ref|`` as ``numpy.isclose``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
import numpy as np
import onnxruntime as ort

from qconsist.errors import InputError, UnavailableError, UnsupportedModelError
from qconsist.inputs.inputset import InputSet, InputSpec

log = logging.getLogger(__name__)

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def provider_name(provider: str) -> str:
    """The ORT execution provider for ``cpu`` / ``cuda``; ``UnavailableError`` if this onnxruntime lacks it."""
    name = PROVIDERS[provider]
    if provider == "cuda":
        from qconsist.inference.session import preload_cuda

        preload_cuda()
    if name not in ort.get_available_providers():
        raise UnavailableError(
            f"{name} is not available in this onnxruntime ({', '.join(ort.get_available_providers())}); "
            "install onnxruntime-gpu on a machine with CUDA, or use provider = \"cpu\""
        )
    return name


def ort_message(exc: BaseException) -> str:
    """onnxruntime's error text without its error-code prefix and C++ source location."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"^Load model from .*? failed:\s*", "", text)
    text = re.sub(r"^/\S+:\d+ .*?\) (?=[A-Z])", "", text)
    return text or type(exc).__name__


def open_session(path: Path, provider: str = "cpu") -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), so, providers=[provider_name(provider)])
    except (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidGraph,
            ort.capi.onnxruntime_pybind11_state.InvalidArgument, ort.capi.onnxruntime_pybind11_state.NotImplemented) as exc:
        raise UnsupportedModelError(f"onnxruntime {ort.__version__} cannot load {path}: {ort_message(exc)}") from None


def input_specs(session: ort.InferenceSession) -> list[InputSpec]:
    specs = []
    for item in session.get_inputs():
        if item.type not in _ORT_TYPES:
            raise UnsupportedModelError(f"model input '{item.name}' has type {item.type}, which qconsist cannot feed")
        specs.append(InputSpec(name=item.name, dtype=np.dtype(_ORT_TYPES[item.type]), shape=tuple(item.shape)))
    return specs


def run_outputs(session: ort.InferenceSession, inputs: InputSet) -> list[dict[str, np.ndarray]]:
    """Every sample's outputs, by output name, in input order."""
    checked = inputs.checked(input_specs(session))
    names = [o.name for o in session.get_outputs()]
    results = []
    for sample in checked:
        values = session.run(names, sample)
        results.append(dict(zip(names, values)))
    return results


@dataclass(frozen=True)
class OutputComparison:
    """How far one model's outputs are from a reference model's, over an input set."""

    samples: int
    elements: int
    mismatched: int
    max_abs_diff: float
    max_rel_diff: float
    worst_output: str
    worst_sample: int
    worst_index: tuple[int, ...]
    atol: float | None
    rtol: float | None
    top1_agreement: float

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    def __bool__(self) -> bool:
        return self.passed

    def summary(self) -> str:
        pct = 100.0 * self.mismatched / self.elements if self.elements else 0.0
        return (
            f"Mismatched elements: {self.mismatched} / {self.elements} ({pct:.1f}%); greatest absolute difference "
            f"{self.max_abs_diff:.3g} at {self.worst_output}{list(self.worst_index)} of sample {self.worst_sample}; "
            f"greatest relative difference {self.max_rel_diff:.3g} (atol {self.atol}, rtol {self.rtol})"
        )

    def to_json(self) -> dict:
        data = asdict(self)
        data["worst_index"] = list(self.worst_index)
        data["passed"] = self.passed
        for key in ("max_rel_diff", "max_abs_diff"):
            if not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data


def _top1(values: np.ndarray) -> np.ndarray:
    flat = values.reshape(values.shape[0], -1) if values.ndim > 1 else values.reshape(1, -1)
    return flat.argmax(axis=1)


def compare_outputs(
    reference: list[dict[str, np.ndarray]],
    candidate: list[dict[str, np.ndarray]],
    atol: float | None,
    rtol: float | None,
) -> OutputComparison:
    """Compare two runs' outputs sample by sample. ``atol``/``rtol`` None: record only, nothing mismatches."""
    if len(reference) != len(candidate) or not reference:
        raise InputError(f"cannot compare {len(reference)} reference samples with {len(candidate)} candidate samples")
    elements = mismatched = 0
    max_abs = max_rel = 0.0
    worst = ("", 0, ())
    agree = 0
    for index, (ref, got) in enumerate(zip(reference, candidate)):
        for name, ref_value in ref.items():
            a = np.asarray(ref_value, dtype=np.float64)
            b = np.asarray(got[name], dtype=np.float64)
            diff = np.abs(a - b)
            diff = np.where(np.isnan(diff), np.inf, diff)
            elements += diff.size
            if diff.size and float(diff.max()) >= max_abs:
                position = np.unravel_index(int(diff.argmax()), diff.shape)
                if float(diff.max()) > max_abs or not worst[0]:
                    worst = (name, index, tuple(int(p) for p in position))
                max_abs = float(diff.max())
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(diff == 0, 0.0, diff / np.abs(a))
            if rel.size:
                max_rel = max(max_rel, float(rel.max()))
            if atol is not None and rtol is not None:
                mismatched += int(np.count_nonzero(~(diff <= atol + rtol * np.abs(a))))
        first = next(iter(ref))
        agree += int(np.array_equal(_top1(np.asarray(ref[first])), _top1(np.asarray(got[first]))))
    return OutputComparison(
        samples=len(reference), elements=elements, mismatched=mismatched, max_abs_diff=max_abs,
        max_rel_diff=max_rel, worst_output=worst[0], worst_sample=worst[1], worst_index=worst[2],
        atol=atol, rtol=rtol, top1_agreement=agree / len(reference),
    )


def outputs_of(path: Path, inputs: InputSet, provider: str = "cpu") -> list[dict[str, np.ndarray]]:
    return run_outputs(open_session(path, provider), inputs)

