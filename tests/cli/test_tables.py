"""Tables that fit: every node table of quant-error, diff and sensitivity is readable at 80 and at 200 columns
(no node name cut to ``conv_…``), every cut list says how much it left out, and with ``--atol`` diff's table
lists the nodes beyond the tolerance. On a model whose node names are as long as a TensorFlow export's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from typer.testing import CliRunner

from onnx_builders import save_arrays
from qconsist.cli import app
from qconsist.cli.table import Rows, fill, more

BLOCKS = 14
PREFIX = "resnet_v1_50/block3/unit_{:02d}/bottleneck_v1"


def _long_named_convnet(path: Path) -> Path:
    """``BLOCKS`` Conv → Relu blocks on 1×4×8×8, then GlobalAveragePool → Flatten → Gemm → Softmax; node and
    tensor names of 50 to 60 characters."""
    rng = np.random.default_rng(5)
    nodes, initializers, previous = [], [], "input_image"
    for block in range(BLOCKS):
        prefix = PREFIX.format(block)
        weight, bias = f"{prefix}/conv2/weights", f"{prefix}/conv2/biases"
        initializers += [numpy_helper.from_array(rng.normal(0, 0.4, (4, 4, 3, 3)).astype(np.float32), weight),
                         numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), bias)]
        nodes += [helper.make_node("Conv", [previous, weight, bias], [f"{prefix}/conv2/Conv2D:0"], name=f"{prefix}/conv2/Conv2D", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"{prefix}/conv2/Conv2D:0"], [f"{prefix}/conv2/Relu:0"], name=f"{prefix}/conv2/Relu")]
        previous = f"{prefix}/conv2/Relu:0"
    initializers += [numpy_helper.from_array(rng.normal(0, 0.5, (5, 4)).astype(np.float32), "logits/weights"),
                     numpy_helper.from_array(rng.normal(0, 0.1, (5,)).astype(np.float32), "logits/biases")]
    nodes += [helper.make_node("GlobalAveragePool", [previous], ["resnet_v1_50/pool5:0"], name="resnet_v1_50/pool5"),
              helper.make_node("Flatten", ["resnet_v1_50/pool5:0"], ["resnet_v1_50/flatten:0"], name="resnet_v1_50/flatten"),
              helper.make_node("Gemm", ["resnet_v1_50/flatten:0", "logits/weights", "logits/biases"], ["resnet_v1_50/logits:0"],
                               name="resnet_v1_50/logits/MatMul", transB=1),
              helper.make_node("Softmax", ["resnet_v1_50/logits:0"], ["predictions"], name="resnet_v1_50/predictions/Softmax", axis=1)]
    graph = helper.make_graph(nodes, "long_names", [helper.make_tensor_value_info("input_image", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("predictions", TensorProto.FLOAT, [1, 5])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _invoke(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code in (0, 1), (result.exit_code, result.output)
    return result


@pytest.fixture(scope="module")
def long_names(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("long-names")
    model = _long_named_convnet(folder / "model.onnx")
    arrays = save_arrays(folder / "arrays.npy", 6, seed=3, shape=(4, 8, 8))
    other = folder / "other.npy"  # calibration B: wider ranges, so every scale differs
    np.save(other, 1.5 * np.load(save_arrays(folder / "other-source.npy", 6, seed=4, shape=(4, 8, 8))))
    runs = folder / "runs"
    for name, calibration in (("pipeline", arrays), ("pipeline-b", other)):
        (folder / f"{name}.toml").write_text(f'name = "long_names"\n[model]\nonnx = "{model}"\n[calibration]\ndata = "{calibration}"\n'
                                             f'[evaluation]\ndata = "{arrays}"\n')
        _invoke("pipeline", "run", folder / f"{name}.toml", "--runs-dir", runs, "--run-id", name)
    for name, pipeline in (("a", "pipeline"), ("b", "pipeline-b")):
        _invoke("run", runs / pipeline, "--inputs", arrays, "--level", "disable", "--dump", "--raw", "all",
                "--runs-dir", runs, "--run-id", name)
    _invoke("run", runs / "pipeline-b", "--inputs", arrays, "--level", "disable", "--dump", "--runs-dir", runs, "--run-id", "c")
    return {"runs": runs, "arrays": arrays}


def _names(text: str) -> set[str]:
    return set(re.findall(r"resnet_v1_50/block3/unit_\d\d/bottleneck_v1/conv2/(?:Conv2D|Relu)", text))


def _at(columns: int, monkeypatch: pytest.MonkeyPatch, *args) -> str:
    """The command's output on a terminal ``columns`` wide."""
    import qconsist.cli.diff
    import qconsist.cli.quant_error
    import qconsist.cli.sensitivity

    def console() -> Console:
        return Console(width=columns, highlight=False, soft_wrap=True, markup=False, force_terminal=False)

    for module in (qconsist.cli.diff, qconsist.cli.quant_error, qconsist.cli.sensitivity):
        monkeypatch.setattr(module, "stdout_console", console)
    return _invoke(*args).output


def _whole_on_a_line(text: str) -> list[str]:
    """Lines where a name is cut (``resnet_v1_50/block3/unit_…``)."""
    return [line for line in text.splitlines() if re.search(r"resnet_v1_50/[^\s│]*(…|\.\.\.)", line)]


def _rows(text: str) -> list[str]:
    """The node of each row: a table's first cell (``│ NAME …``), or a record's first line (``NAME``)."""
    return [match.group(1) for line in text.splitlines() if (match := re.match(r"(?:│ )?(resnet_v1_50/\S+)(?: |$)", line))]


@pytest.mark.parametrize("columns", [80, 200])
def test_quant_error_shows_whole_node_names(long_names, monkeypatch, columns):
    import json

    args = ("quant-error", long_names["runs"] / "pipeline", "--inputs", long_names["arrays"])
    ranked = [entry["node"] for entry in json.loads(_invoke(*args, "--json").output)["tensors"]]
    text = _at(columns, monkeypatch, *args, "--top", "10")
    assert _whole_on_a_line(text) == []
    assert _rows(text) == ranked[:10]
    assert f"… {len(ranked) - 10} more nodes (--top N, --json)\n" in text
    table = text.split("\n", 2)[2].split("… ", 1)[0]
    assert max(len(line) for line in table.splitlines()) <= columns
    assert table.startswith("resnet_v1_50/" if columns == 80 else "┏━")  # 80: records, the name on its own line


def _labels(text: str, labels: list[str]) -> list[str]:
    """The node of each row among ``labels``: a table's first cell (``│ NAME │``), or a record's first line."""
    known = set(labels)
    found = []
    for line in text.splitlines():
        cell = line[2:].split(" │", 1)[0].strip() if line.startswith("│ ") else line
        if cell in known:
            found.append(cell)
    return found


@pytest.mark.parametrize("columns", [80, 200])
def test_diff_shows_whole_node_names_and_says_how_many_more(long_names, monkeypatch, columns):
    import json

    runs = long_names["runs"]
    diverging = json.loads(_invoke("diff", runs / "a", runs / "b", "--json").output)["tensors"]["beyond"]
    text = _at(columns, monkeypatch, "diff", runs / "a", runs / "b")
    assert _whole_on_a_line(text) == []
    assert f"tensors: {len(diverging)} of 86 diverge (optimized graph)" in text
    rows = _labels(text, diverging)
    assert len(rows) == 16 and len(diverging) == 68  # every origin node (the first diverging node is one)
    assert rows == [name for name in diverging if name in rows]
    assert f"… {len(diverging) - len(rows)} more diverging nodes (--json lists all)\n" in text
    assert "… 22 more scale / zero-point tensors (--json lists all)\n" in text
    assert "  … 21 more tensors (--json lists all)\n" in text


def test_diff_with_a_tolerance_lists_the_nodes_beyond_it(long_names, monkeypatch):
    import json

    runs = long_names["runs"]
    data = json.loads(_invoke("diff", runs / "a", runs / "b", "--atol", "0.05", "--json").output)
    beyond, every = data["tensors"]["beyond"], [node["label"] for node in data["tensors"]["nodes"]]
    assert 0 < len(beyond) < len(every)
    text = _at(200, monkeypatch, "diff", runs / "a", runs / "b", "--atol", "0.05")
    rows = _labels(text, every)
    assert rows and set(rows) <= set(beyond)
    assert all(line.rstrip(" │").endswith(("beyond", "unknown")) for line in text.splitlines() if line[2:].split(" │")[0].strip() in every)
    assert f"… {len(beyond) - len(rows)} more nodes beyond the tolerance (--json lists all)\n" in text or len(rows) == len(beyond)


def test_rows_fit_or_become_records():
    rows = Rows("node", "op", "SQNR dB")
    rows.add("resnet_v1_50/block3/unit_05/bottleneck_v1/conv2/Conv2D", "Conv", "23.41")
    rows.add("resnet_v1_50/block3/unit_06/bottleneck_v1/conv2/Relu", "Relu", "-")
    narrow = Console(width=40, highlight=False, markup=False)
    with narrow.capture() as captured:
        rows.print(narrow)
    assert captured.get() == ("resnet_v1_50/block3/unit_05/bottleneck_v1/conv2/Conv2D\n"
                              "    op Conv; SQNR dB 23.41\n"
                              "resnet_v1_50/block3/unit_06/bottleneck_v1/conv2/Relu\n"
                              "    op Relu\n")
    wide = Console(width=80, highlight=False, markup=False)
    with wide.capture() as captured:
        rows.print(wide)
    assert captured.get().splitlines()[3] == "│ resnet_v1_50/block3/unit_05/bottleneck_v1/conv2/Conv2D │ Conv │ 23.41   │"
    assert fill(["a 1", "b 22", "c 333"], 9) == ["a 1; b 22;", "c 333"]
    assert more(10, 47, "nodes", "--top N, --json") == "… 37 more nodes (--top N, --json)"
    assert more(10, 10, "nodes", "--json") is None


def test_diff_rerun_commands_stay_short(long_names):
    """Without raw tensors in run C, diff says how to capture them: not 68 node names, the other run's dump."""
    runs = long_names["runs"]
    text = _invoke("diff", runs / "a", runs / "c").output
    lines = text.splitlines()
    at = lines.index("element statistics need raw tensors; capture them with:")
    commands = lines[at + 1:at + 3]
    assert all(len(command) < 400 for command in commands), commands
    assert commands[0].endswith(f"--dump --raw auto --reference {runs.resolve() / 'c'}")
    assert commands[1].endswith(f"--dump --raw auto --reference {runs.resolve() / 'a'}")
    assert commands[0].startswith(f"  qconsist run {runs.resolve() / 'pipeline'} ")
