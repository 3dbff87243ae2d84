"""The one ONNX loader: every ``.onnx`` file qconsist reads goes through ``read_onnx``, with one error mapping.

A file that onnx cannot parse (missing, truncated, not protobuf, external data that is not there) is a user
error of one line: ``<what> <path> is not a readable ONNX model: <onnx's reason>``. Who is at fault decides the
kind: a file the user gave is an ``InputError``; a file inside a run directory a ``RunStoreError``.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from qconsist.errors import InputError, QconsistError

REASON_CHARS = 200  # onnx's reason, on one line, cut here: protobuf messages can run to kilobytes


def read_onnx(path: str | Path, *, external_data: bool = False, what: str = "",
              error: type[QconsistError] = InputError) -> onnx.ModelProto:
    """The ONNX model at ``path``; ``external_data`` also reads its tensors stored beside it (as ``onnx.load``
    does by default). ``what`` names the file in the error (``"the quantize artifact"``)."""
    try:
        return onnx.load(str(path), load_external_data=external_data)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError, OSError, ValueError…
        reason = " ".join(str(exc).split())[:REASON_CHARS]
        raise error(f"{what + ' ' if what else ''}{path} is not a readable ONNX model: {reason}") from None


def ai_onnx_opset(model: onnx.ModelProto) -> int | None:
    """A model's ai.onnx opset as onnxruntime reads it (``None``: it imports none): the domains ``""`` and
    ``"ai.onnx"`` are one, and where a model lists it twice the last entry holds (onnxruntime keeps the last;
    the first can be an exporter's stray ``ai.onnx`` version 1 beside the real ``""`` version 12)."""
    found = [entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")]
    return found[-1] if found else None
