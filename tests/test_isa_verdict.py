"""Verdicts within the instruction-set spread of their threshold (one definition, ``qconsist.pipeline.isaspread``,
for the pipeline's quantize check and the gate's isa.spread), the ``locate --ep cpu`` record they read, and a pin
onnxruntime cannot load (``session.x64quantprecision=1`` on a QDQ model whose int8 constant feeds two nodes).

Real emulation (``qemu-x86_64``) on models built in code (``isa_models.py``); as in test_emulation.py the
expectations follow this machine's processor: where its u8·s8 sums are exact, an emulated Haswell differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from isa_models import saturating_float_model, saturating_inputs, shared_constant_float_model
from qconsist.cli import app
from qconsist.cpu import instruction_set
from qconsist.inference.session import ort_message
from qconsist.store.run import Run

NATIVE = instruction_set()
DIFFERS = not NATIVE.saturates
HERE = f"native {NATIVE.kernels}"
def cannot_load(model: Path) -> str:
    """The line for a pinned session onnxruntime refuses, with onnxruntime's own words for ``model`` asked here (its
    text names a line of its graph.cc, which moves between versions: 4142 in 1.31.1, 4164 in 1.32.0)."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    with pytest.raises(Exception) as refused:  # noqa: PT011 - onnxruntime raises its own Fail
        ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    words = ort_message(refused.value)
    assert "AddInitializedOrtValue Attempt to replace the existing tensor" in words  # the failure docs/numerics.md traces
    return f"session.x64quantprecision=1 cannot load the quantized model: onnxruntime {ort.__version__}: {words}"


def test_a_verdict_within_the_spread_of_its_threshold():
    from qconsist.pipeline.isaspread import FigureSpread  # the one definition (pipeline and gate)

    straddles = FigureSpread("y SQNR", {"native AVX-512 VNNI": 14.8, "Haswell": 15.2}, 15.0, " dB")
    assert straddles.within and round(straddles.spread, 6) == 0.4
    assert straddles.describe() == ("y SQNR 14.80 dB vs floor 15 dB, within the instruction-set spread 0.40 dB "
                                    "(native AVX-512 VNNI 14.80 dB, Haswell 15.20 dB): the verdicts differ between them")
    # both pass, by a margin (0.1 dB) smaller than what the instruction set moves the figure (0.3 dB)
    close = FigureSpread("y SQNR", {"native": 15.1, "Haswell": 15.4}, 15.0, " dB")
    assert close.within
    assert close.describe().endswith("within the instruction-set spread 0.30 dB (native 15.10 dB, Haswell 15.40 dB): "
                                     "the verdict can flip on another CPU")
    far = FigureSpread("y SQNR", {"native": 20.0, "Haswell": 20.4}, 15.0, " dB")
    assert not far.within
    assert far.describe() == ("y SQNR 20.00 dB vs floor 15 dB, outside the instruction-set spread 0.40 dB "
                              "(native 20.00 dB, Haswell 20.40 dB)")
    assert not FigureSpread("y SQNR", {"native": 15.0, "Haswell": 15.0}, 15.0, " dB").within  # no spread: holds
    top1 = FigureSpread("top-1 agreement", {"native": 0.78, "Haswell": 0.89}, 0.8, "%")
    assert top1.within and top1.describe().startswith("top-1 agreement 78.0% vs floor 80.0%, within the "
                                                      "instruction-set spread 11 points (native 78.0%, Haswell 89.0%): the verdicts differ between them")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A pipeline run of the float model whose Adds share one constant (quantized: one int8 initializer and one
    DequantizeLinear for both), and its pipeline file."""
    folder = tmp_path_factory.mktemp("shared")
    shared_constant_float_model(folder / "float.onnx")
    saturating_inputs(folder / "data.npy", 8)
    text = ('name = "shared"\n[model]\nonnx = "float.onnx"\n[calibration]\ndata = "data.npy"\ncount = 4\n'
            '[quantize]\nper_channel = true\nmin_sqnr_db = 20\n[evaluation]\ndata = "data.npy"\noffset = 4\ncount = 4\n')
    (folder / "p.toml").write_text(text)
    (folder / "pinned.toml").write_text(text + "[isa]\npin = true\n")
    out = CliRunner().invoke(app, ["pipeline", "run", str(folder / "p.toml"), "--runs-dir", str(folder / "runs"),
                                   "--run-id", "q"])
    assert out.exit_code == 0, out.output
    return folder


def test_a_pin_that_cannot_load_fails_the_pipeline_and_the_gate_with_onnxruntimes_line(shared):
    out = CliRunner().invoke(app, ["pipeline", "run", str(shared / "pinned.toml"), "--runs-dir", str(shared / "pinned"),
                                   "--run-id", "p"])
    assert out.exit_code == 1, out.output
    CANNOT_LOAD = cannot_load(shared / "runs" / "q" / "quantize" / "model.onnx")
    assert f"FAILED check quantize across instruction sets: [isa] pin: {CANNOT_LOAD}" in out.output.splitlines()
    run = Run.open(shared / "pinned" / "p")
    check = next(s for s in run.stages if s["name"] == "quantize")["checks"]["instruction_sets"]
    assert check["passed"] is False and check["pin_error"] == CANNOT_LOAD
    listed = CliRunner().invoke(app, ["runs", "list", "--runs-dir", str(shared / "pinned"), "--json"])
    assert [r["verdict"] for r in json.loads(listed.stdout)["runs"]] == ["FAIL (check quantize)"]
    policy = shared / "gate-pin.toml"
    policy.write_text('[drift.float]\nmin_sqnr_db = 20.0\n[isa]\nspread = ["haswell"]\npin = true\n')
    out = CliRunner().invoke(app, ["gate", str(shared / "runs" / "q"), "--policy", str(policy), "--json"])
    assert out.exit_code == 1
    check = next(c for c in json.loads(out.stdout)["checks"] if c["name"] == "isa.spread")
    assert check["status"] == "fail" and check["message"] == f"[isa] pin: {CANNOT_LOAD}"


def _locate_cpu(shared: Path, isas: str, run_id: str):
    """``locate --ep cpu`` of the shared-constant pipeline run's quantized model, one sample, under ``isas``."""
    runs = shared / "runs"
    out = CliRunner().invoke(app, ["locate", str(runs / "q"), "--stage", "quantize", "--inputs", str(shared / "data.npy"),
                                   "--count", "1", "--ep", "cpu", "--isa", isas, "--runs-dir", str(runs),
                                   "--run-id", run_id, "--timed-runs", "3"])
    assert out.exit_code == 0, out.output
    return out


@pytest.mark.slow
def test_locate_cpu_never_recommends_a_setting_that_cannot_load(shared):
    runs = shared / "runs"
    out = _locate_cpu(shared, "native,haswell", "lch")
    lines = out.output.splitlines()
    reason = cannot_load(runs / "q" / "quantize" / "model.onnx").split(": ", 1)[1]
    assert f"session.x64quantprecision=1: cannot load under this setting: {reason}" in lines
    record = Run.open(runs / "lch")
    assert record.kind == "locate-cpu" and f"record: {runs / 'lch'} (the gate's [isa] checks and the pipeline's read it by the model's md5)" in lines
    result = record.manifest.sections["locate_cpu"]
    assert result["cannot_load"] == {"x64quantprecision": reason}
    assert record.manifest.model["md5"] == result["md5"] == Run.open(runs / "q").stage("quantize")["artifact"]["md5"]
    pinned = [c for c in result["cells"] if c["setting"] == "x64quantprecision"]
    assert [c["load_error"] for c in pinned] == [reason, reason] and "x64quantprecision" not in result["native_ms"]
    assert result["identical"]["x64quantprecision"] is False
    if DIFFERS:  # the default saturates under Haswell; the float QDQ groups hold on both: the next setting
        assert result["identical"]["default"] is False and result["recommended"] == "disable_quant_qdq"
        assert [line for line in lines if line.startswith("recommendation: ")][0].startswith(
            "recommendation: session.disable_quant_qdq=1: final outputs bit-identical on native, Haswell; cost here ")
        haswell = next(c for c in result["cells"] if c["isa"] == "Haswell" and c["setting"] == "default")
        assert haswell["origins"] and haswell["first_node"]


@pytest.mark.slow
def test_the_gate_and_the_pipeline_read_a_locate_cpu_record_of_the_model(shared):
    runs = shared / "runs"
    out = _locate_cpu(shared, "native,nehalem", "lcn")
    result = Run.open(runs / "lcn").manifest.sections["locate_cpu"]
    md5 = result["md5"]
    # under Nehalem (no AVX2) the option changes nothing, and the session loads
    nehalem = next(c for c in result["cells"] if c["isa"] == "Nehalem" and c["setting"] == "x64quantprecision")
    assert nehalem["load_error"] is None and "loads; native cannot" in out.output
    listed = json.loads(CliRunner().invoke(app, ["runs", "list", "--runs-dir", str(runs), "--json"]).output)["runs"]
    assert next(r for r in listed if r["name"] == "lcn")["kind"] == "locate-cpu"
    assert next(r for r in listed if r["name"] == "lcn")["verdict"] == "—"
    if NATIVE.saturates:
        return  # native AVX2 without VNNI saturates where Nehalem's SSE kernel does not: no identity to read
    assert result["identical"]["default"] is True and result["recommended"] == "default"
    policy = shared / "gate-nehalem.toml"
    policy.write_text('[drift.float]\nmin_sqnr_db = 20.0\n[isa]\nspread = ["nehalem"]\n')
    out = CliRunner().invoke(app, ["gate", str(runs / "q"), "--policy", str(policy), "--json"])
    check = next(c for c in json.loads(out.stdout)["checks"] if c["name"] == "isa.spread")
    assert check["status"] == "pass" and check["measured"]["record"] == str(runs / "lcn")
    assert check["message"] == (f"drift.float's verdict holds on native, Nehalem: with onnxruntime's default integer "
                                f"path, locate --ep cpu record {runs / 'lcn'}: final outputs bit-identical on native, "
                                f"Nehalem (model md5 {md5}): the figures cannot differ between them")
    # the same pipeline again: the same quantized md5, so its quantize check reads the record
    out = CliRunner().invoke(app, ["pipeline", "run", str(shared / "p.toml"), "--runs-dir", str(runs), "--run-id", "q2"])
    assert out.exit_code == 0, out.output
    assert (f"  check quantize across instruction sets: with onnxruntime's default integer path, locate --ep cpu "
            f"record {runs / 'lcn'}: final outputs bit-identical on native, Nehalem: the verdict holds on them"
            ) in out.output.splitlines()


@pytest.mark.slow
def test_the_pipeline_fails_a_verdict_within_the_instruction_set_spread(tmp_path):
    saturating_float_model(tmp_path / "float.onnx")
    saturating_inputs(tmp_path / "data.npy", 8)
    (tmp_path / "p.toml").write_text('name = "sat"\n[model]\nonnx = "float.onnx"\n[calibration]\ndata = "data.npy"\n'
                                     'count = 4\n[quantize]\nper_channel = true\nmin_sqnr_db = 30\n[evaluation]\n'
                                     'data = "data.npy"\noffset = 4\ncount = 4\n[isa]\nspread = ["haswell"]\n')
    out = CliRunner().invoke(app, ["pipeline", "run", str(tmp_path / "p.toml"), "--runs-dir", str(tmp_path / "runs"),
                                   "--run-id", "s"])
    check = next(s for s in Run.open(tmp_path / "runs" / "s").stages if s["name"] == "quantize")["checks"]["instruction_sets"]
    figure = check["figures"][0]
    assert figure["label"] == "y SQNR" and list(figure["values"]) == [HERE, "Haswell"]
    native, haswell = figure["values"][HERE], figure["values"]["Haswell"]
    assert native > 30  # measured here: 50.0 dB natively (VNNI), 0.50 dB under Haswell
    if not DIFFERS:
        assert out.exit_code == 0 and check["passed"] is True and check["identical"] == {"Haswell": True}
        return
    assert out.exit_code == 1 and check["passed"] is False and check["identical"] == {"Haswell": False}
    assert haswell < 1.0
    line = (f"y SQNR {native:.2f} dB vs floor 30 dB, within the instruction-set spread {native - haswell:.2f} dB "
            f"({HERE} {native:.2f} dB, Haswell {haswell:.2f} dB): the verdicts differ between them")
    assert f"FAILED check quantize across instruction sets: {line} ([isa])" in out.output.splitlines()
    assert ("  check quantize across instruction sets: with onnxruntime's default integer path, outputs differ from "
            "native on Haswell") in out.output.splitlines()


def test_a_pin_alone_checks_that_the_pinned_session_loads(tmp_path):
    saturating_float_model(tmp_path / "float.onnx")
    saturating_inputs(tmp_path / "data.npy", 8)
    (tmp_path / "p.toml").write_text('name = "sat"\n[model]\nonnx = "float.onnx"\n[calibration]\ndata = "data.npy"\n'
                                     'count = 4\n[quantize]\nper_channel = true\n[isa]\npin = true\n')
    out = CliRunner().invoke(app, ["pipeline", "run", str(tmp_path / "p.toml"), "--runs-dir", str(tmp_path / "runs"),
                                   "--run-id", "s"])
    assert out.exit_code == 0, out.output
    assert ("  check quantize across instruction sets: with session.x64quantprecision=1: the session loads; no other "
            "instruction set measured ([isa] spread lists QEMU CPU models)") in out.output.splitlines()
    run = Run.open(tmp_path / "runs" / "s")
    assert next(s for s in run.stages if s["name"] == "quantize")["checks"]["instruction_sets"]["passed"] is True
    assert run.sections["pipeline"]["isa"] == {"spread": [], "pin": True}
    bad = tmp_path / "bad.toml"
    bad.write_text((tmp_path / "p.toml").read_text().replace("pin = true", "pin = true\nspred = []"))
    out = CliRunner().invoke(app, ["pipeline", "run", str(bad), "--runs-dir", str(tmp_path / "runs")])
    assert out.exit_code == 2
    assert out.output.strip().splitlines()[-1] == f"error: {bad.resolve()}: unknown key 'isa.spred' (known in [isa]: pin, spread)"
    unknown = tmp_path / "unknown.toml"
    unknown.write_text((tmp_path / "p.toml").read_text() + 'spread = ["pentium9"]\n')
    out = CliRunner().invoke(app, ["pipeline", "run", str(unknown), "--runs-dir", str(tmp_path / "runs")])
    assert out.exit_code == 2
    assert out.output.strip().splitlines()[-1].startswith("error: --isa 'pentium9' is not a CPU model QEMU knows: ")
