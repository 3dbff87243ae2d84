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


# A node the model leaves unnamed is called by a name qconsist invents, marked as invented wherever it is printed
# or recorded: "~" then its op type and its position in the graph ("~Sigmoid_118"). onnxruntime's
# ``nodes_to_exclude`` cannot take it (the model has no such name); the optimize stage's ``name_nodes`` gives
# unnamed nodes real, recorded names (the same text without the mark).
INVENTED_MARK = "~"


def invented_name(op_type: str, index: int) -> str:
    """The name qconsist gives the unnamed node at ``index`` of a graph, marked as invented."""
    return f"{INVENTED_MARK}{op_type}_{index}"


def node_label(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or for an unnamed node the invented one (``invented_name``)."""
    return node.name or invented_name(node.op_type, index)


def is_invented(label: str) -> bool:
    """Whether a node label is a name qconsist invented for an unnamed node."""
    return label.startswith(INVENTED_MARK)
