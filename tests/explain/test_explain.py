"""qconsist explain: the graph transformer that makes two runs diverge, on a small QDQ model built here (whose
QDQ -> QLinearConv fusion breaks rounding ties differently) and on the real open_nsfw model."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import ConfigError, RunStoreError
from qconsist.explain import explain_optimization, parse_transformer_log, transformer_activity
from qconsist.explain.bisect import minimal_set
from qconsist.inference.session import ExecutionOptions, optimizer_log

from explain.qdq_models import qdq_conv_model, qdq_inputs

SELECTOR = "QDQSelectorActionTransformer"


def _run(*args: str) -> None:
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output


@pytest.fixture
def qdq_runs(tmp_path: Path) -> dict[str, Path]:
    model = qdq_conv_model(tmp_path / "qdq_conv.onnx")
    inputs = qdq_inputs(tmp_path / "x.npy")
    for level in ("disable", "all"):
        _run(str(model), "--inputs", str(inputs), "--level", level, "--dump", "--run-id", level)
    return {"model": model, "inputs": inputs, "disable": Path("runs/disable"), "all": Path("runs/all")}


def test_onnxruntime_names_the_transformers_it_applies(tmp_path):
    model = qdq_conv_model(tmp_path / "m.onnx")
    applied = transformer_activity(model, ExecutionOptions())
    assert applied.modifying == ["QDQSelectorActionTransformer", "NhwcTransformer"]
    levels = {t.name: t.level for t in applied.transformers}
    assert levels["ConstantFolding"] == 1 and levels[SELECTOR] == 2 and levels["NchwcTransformer"] == 3
    assert SELECTOR not in transformer_activity(model, ExecutionOptions(graph_optimization_level="disable")).names
    # switched off, it is not applied: the names are the ones disabled_optimizers takes
    off = transformer_activity(model, ExecutionOptions(disabled_optimizers=(SELECTOR,)))
    assert SELECTOR not in off.names and off.modifying == []
    assert "GraphTransformer QDQSelectorActionTransformer modified: 1" in optimizer_log(model, ExecutionOptions())


def test_the_log_parser_keeps_onnxruntime_order_and_any_modification():
    text = "\n".join([
        "... Graph transformer step 1 of 10 for level 2 started.",
        "... Applying graph transformer B on step 1.", "... GraphTransformer B modified: 0 with status: OK",
        "... Applying graph transformer A on step 1.", "... GraphTransformer A modified: 1 with status: OK",
        "... Graph transformer step 2 of 10 for level 2 started.",
        "... Applying graph transformer B on step 2.", "... GraphTransformer B modified: 1 with status: OK",
        "... Applying graph transformer A on step 2.", "... GraphTransformer A modified: 0 with status: OK",
    ])
    log = parse_transformer_log(text)
    assert [(t.name, t.level, t.modified) for t in log.transformers] == [("B", 2, True), ("A", 2, True)]
    assert log.from_json(json.loads(json.dumps(log.to_json()))) == log


@pytest.mark.parametrize("culprits, probes", [({"E"}, 4), ({"B", "G"}, 16), (set("ABCDEFGH"), 26)])
def test_minimal_set_finds_every_switch_needed(culprits, probes):
    names = list("ABCDEFGH")
    asked: list[tuple[str, ...]] = []

    def vanishes(subset: tuple[str, ...]) -> bool:  # the effect vanishes only when every culprit is off
        asked.append(subset)
        return culprits <= set(subset)

    assert minimal_set(names, vanishes) == sorted(culprits)
    assert len(asked) == probes and len(set(asked)) == len(asked)


def test_explain_names_the_qdq_fusion_and_switching_it_off_removes_the_divergence(qdq_runs):
    result = CliRunner().invoke(app, ["explain", "runs/disable", "runs/all"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:3] == [
        "reference: runs/disable (level disable)",
        "optimized: runs/all (level all)",
        "first diverging node: conv (2 of 3 tensors diverge)",
    ]
    assert lines[3] == (f"onnxruntime {ort.__version__}: 2 graph transformer(s) changed the graph in the optimized run and not in the "
                        "reference: QDQSelectorActionTransformer (level 2), NhwcTransformer (level 3)")
    assert "responsible: QDQSelectorActionTransformer" in lines
    assert "  rewrote: conv_token_2 (com.microsoft:QLinearConv)" in lines
    assert "  in place of: conv (Conv) computing conv" in lines
    assert lines[-2].startswith("cost: 8 sessions (2 reading onnxruntime's optimizer log, 2 probe(s) × 3), ")
    assert lines[-1] == "verdict: explained"
    data = json.loads(CliRunner().invoke(app, ["explain", "runs/disable", "runs/all", "--json"]).output)
    assert data["schema"] == "qconsist.explain/1" and data["passed"] is True
    assert data["responsible"] == [SELECTOR]
    assert [p["disabled"] for p in data["probes"]] == [["NhwcTransformer", SELECTOR], [SELECTOR]]
    assert data["verification"] == {**data["probes"][1], "vanished": True}
    assert data["rewrites"]["summary"] == ("-3 DequantizeLinear, -1 Conv, -1 QuantizeLinear, +2 Transpose, "
                                           "+1 com.microsoft:QLinearConv")
    assert data["reproduce"].endswith(f"--level all --disable-optimizer {SELECTOR} --offset 0 --count 3 --dump")
    # the answer checked the way a user would: the optimized level with only that transformer off is identical
    _run(str(qdq_runs["model"]), "--inputs", str(qdq_runs["inputs"]), "--level", "all", "--disable-optimizer", SELECTOR,
         "--dump", "--run-id", "off")
    assert CliRunner().invoke(app, ["diff", "runs/disable", "runs/off"]).exit_code == 0
    assert CliRunner().invoke(app, ["diff", "runs/disable", "runs/all"]).exit_code == 1
    manifest = json.loads(Path("runs/off/manifest.json").read_text())
    assert manifest["sections"]["inference"]["options"]["disabled_optimizers"] == [SELECTOR]


def test_identical_runs_have_nothing_to_explain(qdq_runs):
    _run(str(qdq_runs["model"]), "--inputs", str(qdq_runs["inputs"]), "--level", "basic", "--dump", "--run-id", "basic")
    result = explain_optimization("runs/basic", "runs/disable")
    assert result.passed and result.target is None and result.probes == []
    assert result.reference_run == "runs/disable" and result.notes == ["the runs' tensors are bit-identical: nothing to explain"]


def test_explain_refuses_what_it_cannot_bisect(qdq_runs, tmp_path):
    model, inputs = str(qdq_runs["model"]), str(qdq_runs["inputs"])
    _run(model, "--inputs", inputs, "--level", "all", "--threads", "1", "--dump", "--run-id", "threads")
    with pytest.raises(ConfigError, match=r"^the runs also differ in intra_op_threads: explain switches graph transformers "
                                          r"on and off, so the runs must differ only in the optimization level or the "
                                          r"transformers switched off; compare them with qconsist diff$"):
        explain_optimization("runs/disable", "runs/threads")
    with pytest.raises(ConfigError, match=r"^the runs ran with the same execution options"):
        explain_optimization("runs/all", "runs/all")
    _run(model, "--inputs", inputs, "--level", "all", "--run-id", "nodump")
    result = CliRunner().invoke(app, ["explain", "runs/disable", "runs/nodump"])
    assert result.exit_code == 2
    assert result.stderr == "error: run runs/nodump has no tensor dump; rerun it with `qconsist run ... --dump`\n"
    other = qdq_conv_model(tmp_path / "other.onnx", seed=4)
    _run(str(other), "--inputs", inputs, "--level", "all", "--dump", "--run-id", "other")
    with pytest.raises(RunStoreError, match=r"^runs runs/disable and runs/other ran different model files"):
        explain_optimization("runs/disable", "runs/other")
    qdq_inputs(Path(inputs), seed=6)  # the input file changed since the runs
    with pytest.raises(RunStoreError, match=r"^the input set .*x\.npy of run runs/disable has other bytes now"):
        explain_optimization("runs/disable", "runs/all")


def test_disabled_optimizers_are_validated_and_recorded_only_when_set():
    with pytest.raises(ConfigError, match=r"^disabled_optimizers must be graph transformer names such as ConstantFolding, got .ConstantFolding.$"):
        ExecutionOptions(disabled_optimizers="ConstantFolding")
    with pytest.raises(ConfigError, match=r"got \('Constant Folding',\)"):
        ExecutionOptions(disabled_optimizers=("Constant Folding",))
    options = ExecutionOptions(disabled_optimizers=("NhwcTransformer", SELECTOR, "NhwcTransformer"))
    assert options.disabled_optimizers == ("NhwcTransformer", SELECTOR)
    assert ExecutionOptions.from_json(options.to_json()) == options != ExecutionOptions()
    assert "disabled_optimizers" not in ExecutionOptions().to_json()
    result = CliRunner().invoke(app, ["run", "m.onnx", "--inputs", "x.npy", "--disable-optimizer", "Constant Folding"])
    assert result.exit_code == 2
    assert result.stderr == ("error: --disable-optimizer must be graph transformer names such as ConstantFolding, "
                             "got ('Constant Folding',)\n")


def test_explain_names_the_transformer_on_open_nsfw(nsfw_run, tmp_path):
    """open_nsfw QDQ at level disable vs all on the CPU; checked by re-running with only that transformer off."""
    from qconsist.diff import diff_runs

    for level in ("disable", "all"):
        _run(str(nsfw_run.path), "--inputs", "package:photos", "--offset", "12", "--count", "3", "--level", level,
             "--dump", "--run-id", level)
    result = explain_optimization("runs/disable", "runs/all")
    assert (result.target, result.diverging, result.compared) == ("relu_1_DequantizeLinear", 92, 132)
    assert [t.name for t in result.candidates] == [
        "QDQPropagationTransformer", "Level2_RuleBasedTransformer", "QDQS8ToU8Transformer", SELECTOR,
        "NchwcTransformer", "NhwcTransformer"]
    assert result.responsible == [SELECTOR] and result.explained
    assert len(result.probes) == 5 and result.sessions == 17
    assert [str(n) for n in result.replaced] == ["conv_1 (Conv) computing conv_1"]
    assert result.rewritten[0].op_type == "com.microsoft:QLinearConv" and "conv_1" in result.rewritten[0].covers
    _run(str(nsfw_run.path), "--inputs", "package:photos", "--offset", "12", "--count", "3", "--level", "all",
         "--disable-optimizer", SELECTOR, "--dump", "--run-id", "off")
    before, after = diff_runs("runs/disable", "runs/all"), diff_runs("runs/disable", "runs/off")
    assert "relu_1_DequantizeLinear_Output" in {n.key for n in before.tensors.nodes}
    assert "relu_1_DequantizeLinear_Output" not in {n.key for n in after.tensors.nodes}
    assert not before.outputs.identical and after.outputs.identical
    assert [n.label for n in after.tensors.nodes] == ["fc_nsfw_Reshape"]  # another transformer's, after the outputs' last change
