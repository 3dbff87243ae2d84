"""A diff's per-node divergence as Google Model Explorer node data, checked against the graph Model Explorer's own
ONNX adapter builds of the model (node ids and graph id)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.report.explorer import explorer_overlay

from explain.qdq_models import qdq_conv_model, qdq_inputs

# at level all the conv and its Q/DQ nodes are one QLinearConv whose inputs are not observed: a span (3), not an
# origin (issue 27: main coloured them as an origin, 2)
STATUS = {"x_QuantizeLinear": 0, "x_DequantizeLinear": 3, "w_DequantizeLinear": 3, "b_DequantizeLinear": 3, "conv": 3,
          "conv_QuantizeLinear": 3, "conv_DequantizeLinear": 1}


def _runs(tmp_path: Path) -> Path:
    model = qdq_conv_model(tmp_path / "qdq_conv.onnx")
    inputs = qdq_inputs(tmp_path / "x.npy")
    for level in ("disable", "all"):
        result = CliRunner().invoke(app, ["run", str(model), "--inputs", str(inputs), "--level", level, "--dump", "--run-id", level])
        assert result.exit_code == 0, result.output
    return model


def test_node_data_colours_the_origin_and_what_it_propagates_to(tmp_path):
    model = _runs(tmp_path)
    overlay = explorer_overlay(diff_runs("runs/disable", "runs/all"))
    assert overlay.model == model and overlay.graph_id == "qdq_conv" and overlay.nodes == 7
    status = overlay.node_data["status"]["qdq_conv"]
    assert {node: r["value"] for node, r in status["results"].items()} == STATUS
    assert status["thresholds"] == [{"value": 0, "bgColor": "#a5d6a7"}, {"value": 1, "bgColor": "#ffcc80"},
                                    {"value": 2, "bgColor": "#ef5350"}, {"value": 3, "bgColor": "#ce93d8"}]
    origin = overlay.node_data["origin"]["qdq_conv"]["results"]
    assert {n for n, r in origin.items() if r["value"] == 1} == set() and set(origin) == set(STATUS)
    shares = overlay.node_data["mismatched"]["qdq_conv"]["results"]
    assert shares["conv"] == {"value": 2 / 3} and shares["x_QuantizeLinear"] == {"value": 0.0}
    greatest = overlay.node_data["greatest_difference"]["qdq_conv"]["results"]
    assert greatest["conv_DequantizeLinear"]["value"] > 0 and greatest["x_QuantizeLinear"]["value"] == 0.0


def test_node_ids_are_the_ones_model_explorer_builds(tmp_path):
    from model_explorer_onnx.main import ONNXAdapter

    model = _runs(tmp_path)
    graphs = ONNXAdapter().convert(str(model), {})["graphs"]
    ids = {graph.id: {node.id for node in graph.nodes} for graph in graphs}
    overlay = explorer_overlay(diff_runs("runs/disable", "runs/all"))
    for data in overlay.node_data.values():
        (graph_id, graph), = data.items()
        assert set(graph["results"]) <= ids[graph_id]


def test_diff_writes_the_files_and_the_report_links_them(tmp_path):
    _runs(tmp_path)
    result = CliRunner().invoke(app, ["diff", "runs/disable", "runs/all", "--explorer", "overlay"])
    assert result.exit_code == 1
    assert sorted(p.name for p in Path("overlay").iterdir()) == ["greatest_difference.json", "mismatched.json", "origin.json",
                                                                 "status.json"]
    assert json.loads(Path("overlay/status.json").read_text())["qdq_conv"]["results"]["conv"] == {"value": 3}
    Path("d.json").write_text(CliRunner().invoke(app, ["diff", "runs/disable", "runs/all", "--json"]).output)
    Path("out").mkdir()  # qconsist creates no folder for an output file
    result = CliRunner().invoke(app, ["report", "d.json", "-o", "out/r.html"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["report: out/r.html", "Model Explorer node data: out/r.explorer/"]
    html = Path("out/r.html").read_text()
    assert '<a href="r.explorer/d/status.json">status</a>' in html
    assert "model-explorer " + str(tmp_path / "qdq_conv.onnx") + " --extensions model_explorer_onnx" in html
    assert json.loads(Path("out/r.explorer/d/origin.json").read_text())["qdq_conv"]["results"]["conv"] == {"value": 0}
    assert json.loads(Path("out/r.explorer/d/status.json").read_text())["qdq_conv"]["results"]["conv"] == {"value": 3}
