"""What counts as a change of computation between two models, and what is only metadata."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.diff.artifacts import AttributeChange, metadata_changes, model_changes, semantic_hash
from qconsist.store.hashing import initializer_digests


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    other = onnx.ModelProto()
    other.CopyFrom(model)
    return other


def test_metadata_is_not_a_change_of_computation(small_models):
    model = onnx.load(str(small_models["classifier"]))
    renamed = _copy(model)
    renamed.graph.name = "/runs/other/convert/model.onnx"
    renamed.producer_name, renamed.doc_string = "another tool", "converted elsewhere"
    renamed.graph.node[0].doc_string = "a note"
    assert semantic_hash(renamed) == semantic_hash(model)
    recorded = {k: v.to_json() for k, v in initializer_digests(model).items()}
    assert semantic_hash(renamed, recorded) == semantic_hash(model)
    assert metadata_changes(model, renamed) == [
        "producer_name: 'qconsist-tests' -> 'another tool'", "doc_string: '' -> 'converted elsewhere'",
        f"graph.name: {model.graph.name!r} -> '/runs/other/convert/model.onnx'",
    ]
    assert model_changes(model, renamed).initializers_changed == ()


def test_weights_and_attributes_are_changes_of_computation(small_models):
    model = onnx.load(str(small_models["classifier"]))
    weights = _copy(model)
    fc_b = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "fc_b")).copy()
    fc_b[2] = np.nextafter(fc_b[2], np.float32(np.inf))  # one ULP in one element
    weights.graph.initializer.remove(next(i for i in weights.graph.initializer if i.name == "fc_b"))
    weights.graph.initializer.append(numpy_helper.from_array(fc_b, "fc_b"))
    assert semantic_hash(weights) != semantic_hash(model)
    changed = model_changes(model, weights).initializers_changed
    assert [(c.name, c.elements_changed, c.consumers) for c in changed] == [("fc_b", 1, ("fc",))]
    attribute = _copy(model)
    next(a for a in attribute.graph.node[-1].attribute if a.name == "axis").i = -1
    assert semantic_hash(attribute) != semantic_hash(model)
    assert model_changes(model, attribute).attributes_changed == (AttributeChange("softmax", "axis"),)
