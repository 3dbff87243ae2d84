"""The locate engine on real CPU divergence (threads 1 vs 3), checked against an independent computation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qconsist.errors import ConfigError
from qconsist.locate.explore import Comparison, Variant, explore
from qconsist.locate.report import sensitive_nodes
from qconsist.inference.session import ExecutionOptions


def _all_tensors(model_path: Path, samples: list, threads: int, tmp: Path) -> tuple[onnx.ModelProto, list[dict]]:
    """Independently of qconsist: ORT's optimized graph, every node output exposed, run with ``threads``."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.optimized_model_filepath = str(tmp / f"opt{threads}.onnx")
    ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp / f"opt{threads}.onnx"))
    exposed = onnx.ModelProto()
    exposed.CopyFrom(optimized)
    known = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for out in node.output:
            if out and out not in known:
                exposed.graph.output.append(onnx.ValueInfoProto(name=out))
                known.add(out)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(exposed.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return optimized, [dict(zip(names, session.run(names, s))) for s in samples]


@pytest.fixture(scope="module")
def independent(nsfw_models, photo_samples, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("independent")
    graph, one = _all_tensors(nsfw_models["qdq"], photo_samples[:2], 1, tmp)
    _, three = _all_tensors(nsfw_models["qdq"], photo_samples[:2], 3, tmp)
    inits = {i.name for i in graph.graph.initializer}
    origins: dict[str, int] = {}
    differing: list[str] = []
    for node in graph.graph.node:
        outs = [o for o in node.output if o]
        ins = [i for i in node.input if i and i not in inits]
        out_differs = [any(not np.array_equal(a[o], b[o]) for o in outs) for a, b in zip(one, three)]
        in_same = [all(np.array_equal(a[i], b[i]) for i in ins if i in a) for a, b in zip(one, three)]
        if any(out_differs):
            differing.append(node.name)
        if any(d and s for d, s in zip(out_differs, in_same)):
            origins[node.name] = sum(  # counted over the samples where the node is an origin
                int(np.count_nonzero(a[o] != b[o]))
                for a, b, d, s in zip(one, three, out_differs, in_same) if d and s for o in outs
            )
    return {"origins": origins, "differing": differing, "outputs": (one, three), "graph": graph}


def test_origin_nodes_match_an_independent_computation(cpu_threads_exploration, independent):
    result = cpu_threads_exploration["results"][0]
    assert not result.identical
    assert independent["origins"], "threads 1 vs 3 must change some convolution on this CPU"
    assert {n.node: n.origin_stats[1] for n in result.origins} == independent["origins"]
    assert [n.node for n in result.nodes] == independent["differing"]
    assert all(n.op_type == "Conv" for n in result.origins)


def test_first_node_and_final_outputs(cpu_threads_exploration, independent):
    result = cpu_threads_exploration["results"][0]
    first = next(n for n in result.nodes)
    assert result.first_node == first.label == "conv_stage2_block0_branch2a"
    one, three = independent["outputs"]
    greatest = max(float(np.max(np.abs(a["prob"].astype(np.float64) - b["prob"]))) for a, b in zip(one, three))
    assert result.effect.greatest_abs == greatest
    agree = sum(int(np.argmax(a["prob"]) == np.argmax(b["prob"])) for a, b in zip(one, three))
    assert result.effect.top1_agree == agree
    assert result.effect.samples == 2


def test_int8_values_changed_match(cpu_threads_exploration, independent):
    result = cpu_threads_exploration["results"][0]
    one, three = independent["outputs"]
    expected = sum(
        int(np.count_nonzero(a[name] != b[name])) for a, b in zip(one, three) for name in a
        if a[name].dtype in (np.int8, np.uint8)
    )
    assert result.int8_changed == expected


def test_fresh_sessions_of_one_config_are_stable_and_observation_faithful(cpu_threads_exploration):
    for report in cpu_threads_exploration["reports"]:
        assert report.stable
        assert [r.phase for r in report.repeats] == ["quiet"]
        assert report.repeats[0].sessions == 2
        assert report.faithful["faithful"] is True
        assert report.faithful["samples_checked"] == 2
        lat = report.latency
        assert lat.runs == 5 and lat.min_ms <= lat.p25_ms <= lat.median_ms <= lat.p75_ms <= lat.max_ms


def test_sensitive_nodes_merge_origins(cpu_threads_exploration, independent):
    nodes = sensitive_nodes(cpu_threads_exploration["tagged"])
    assert {n.why for n in nodes} == {"algorithm"}
    assert len(nodes) == len(independent["origins"])
    assert all(n.between == ("threads=1 vs threads=3",) for n in nodes)


def test_explore_refuses_bad_requests(nsfw_models, photo_samples):
    variants = [Variant("a", ExecutionOptions()), Variant("a", ExecutionOptions(intra_op_threads=1))]
    with pytest.raises(ConfigError, match=r"variant labels must be unique, got \['a', 'a'\]"):
        explore(nsfw_models["qdq"], photo_samples[:1], variants, [], repeats=2)
    with pytest.raises(ConfigError, match="comparison a vs b names an unknown variant"):
        explore(nsfw_models["qdq"], photo_samples[:1], variants[:1], [Comparison("a", "b", "algorithm")], repeats=2)
    with pytest.raises(ConfigError, match="locate needs at least one input sample"):
        explore(nsfw_models["qdq"], [], variants[:1], [], repeats=2)
    with pytest.raises(ConfigError, match=r"repeats must be >= 2"):
        explore(nsfw_models["qdq"], photo_samples[:1], variants[:1], [], repeats=1)
