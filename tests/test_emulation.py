"""--isa: runs under QEMU user mode emulating another processor — the recording, the emulated run, the diff's
cause line, locate --ep cpu's matrix, calib repeat --isa, the gate's spread rule and the exit codes.

Real emulation (``qemu-x86_64``, installed by ``make qemu``) on models built in code: ``isa_models.py``'s QDQ
Conv whose u8·s8 sums saturate on AVX2 without VNNI. What the native side computes depends on this machine's
processor, so the expectations follow ``qconsist.cpu.instruction_set()``: where it sums exactly (VNNI, AMX,
SSE), the emulated Haswell differs; where it saturates too (AVX2 without VNNI), they agree.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from isa_models import saturating_float_model, saturating_inputs, saturating_qdq_model
from qconsist.cli import app
from qconsist.cpu import instruction_set
from qconsist.emulation import emulated_command, qemu_models, run_emulated_capture
from qconsist.inference.emulated import outputs_under
from qconsist.inference.session import ExecutionOptions
from qconsist.inputs.inputset import open_input_set
from qconsist.store.run import Run

NATIVE = instruction_set()
# the native u8·s8 sums are exact, so an emulated Haswell (saturating) computes other integers
DIFFERS = not NATIVE.saturates
PIN = {"session.x64quantprecision": "1"}


@pytest.fixture(scope="module")
def saturating(tmp_path_factory):
    folder = tmp_path_factory.mktemp("isa")
    return {"model": saturating_qdq_model(folder / "sat.onnx"), "inputs": saturating_inputs(folder / "sat.npy"),
            "folder": folder}


def test_an_unknown_cpu_model_exits_2_listing_the_valid_ones(saturating):
    out = CliRunner().invoke(app, ["run", str(saturating["model"]), "--inputs", str(saturating["inputs"]),
                                   "--isa", "pentium9"])
    assert out.exit_code == 2
    line = out.output.strip().splitlines()[-1]
    assert line.startswith("error: --isa 'pentium9' is not a CPU model QEMU knows: use native or one of ")
    assert ", Haswell, " in line and ", Nehalem, " in line
    assert set(qemu_models()) >= {"Haswell", "Nehalem", "Skylake-Server"}


def test_without_qemu_isa_exits_3_saying_what_to_install(saturating, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no qemu-x86_64 on it
    for args in (["run", str(saturating["model"]), "--inputs", str(saturating["inputs"]), "--isa", "haswell"],
                 ["locate", str(saturating["model"]), "--inputs", str(saturating["inputs"]), "--ep", "cpu"],
                 ["calib", "repeat", str(saturating["model"]), "--inputs", str(saturating["inputs"]), "--isa", "native,haswell"]):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 3, args
        assert out.output.strip().splitlines()[-1] == (
            "error: --isa runs the model under QEMU user mode, and qemu-x86_64 is not installed: install the "
            "qemu-user package (apt-get install qemu-user; `make qemu` does it)")
    # native needs no QEMU
    out = CliRunner().invoke(app, ["run", str(saturating["model"]), "--inputs", str(saturating["inputs"]), "--isa", "native",
                                   "--runs-dir", str(tmp_path / "runs"), "--run-id", "n"])
    assert out.exit_code == 0, out.output


@pytest.mark.slow
@pytest.mark.parametrize(("model", "kernels", "floats", "features"), [
    ("Haswell", "AVX2 without VNNI", "FMA3 (NCHWc 8)", ["sse4_1", "sse4_2", "avx", "fma", "avx2"]),
    ("Nehalem", "SSE (no AVX2)", "SSE (NCHWc 8)", ["sse4_1", "sse4_2"]),
])
def test_the_child_reads_the_emulated_processor_with_cpuid(model, kernels, floats, features):
    script = "import json; from qconsist.cpu import instruction_set; print(json.dumps(instruction_set().to_json()))"
    done = run_emulated_capture(emulated_command(model, [sys.executable, "-c", script]))
    assert done.returncode == 0 and done.stderr == ""  # QEMU's warnings about features TCG lacks are gone
    isa = json.loads(done.stdout)
    assert (isa["kernels"], isa["float_kernels"], isa["features"], isa["emulated"]) == (kernels, floats, features, model)
    assert isa["source"] == "cpuid" and model in isa["model"]  # /proc/cpuinfo would have said the host's


@pytest.mark.slow
def test_the_pin_makes_the_integer_path_the_same_on_every_processor(saturating):
    inputs = open_input_set(saturating["inputs"], None, "x")
    default, pinned = ExecutionOptions(intra_op_threads=1), ExecutionOptions(intra_op_threads=1, session_config=PIN)
    native = outputs_under("native", saturating["model"], inputs, default)
    native_pinned = outputs_under("native", saturating["model"], inputs, pinned)
    haswell = outputs_under("Haswell", saturating["model"], inputs, default)
    haswell_pinned = outputs_under("Haswell", saturating["model"], inputs, pinned)
    nehalem = outputs_under("Nehalem", saturating["model"], inputs, default)
    same = lambda a, b: all(np.array_equal(x["y"], y["y"]) for x, y in zip(a, b))  # noqa: E731
    assert same(haswell_pinned, native_pinned)
    assert same(native_pinned, nehalem)  # SSE: exact, the pin has nothing to change there
    assert same(haswell, native) is not DIFFERS
    if DIFFERS:  # measured: sample 0, channel 0 (all weights +127): 13.5 exact, 0.25 saturated
        assert float(native[0]["y"][0, 0, 0, 0]) == 13.5 and float(haswell[0]["y"][0, 0, 0, 0]) == 0.25


@pytest.mark.slow
def test_an_emulated_run_records_its_instruction_set_and_diff_names_the_cause(saturating, tmp_path):
    runs = tmp_path / "runs"
    common = [str(saturating["model"]), "--inputs", str(saturating["inputs"]), "--threads", "1", "--runs-dir", str(runs)]
    native = CliRunner().invoke(app, ["run", *common, "--run-id", "native"])
    assert native.exit_code == 0, native.output
    emulated = CliRunner().invoke(app, ["run", *common, "--run-id", "haswell", "--isa", "haswell"])
    assert emulated.exit_code == 0, emulated.output
    assert "emulating Haswell under QEMU" in emulated.output and "emulated Haswell: the command took" in emulated.output
    environment = Run.open(runs / "haswell").manifest.environment
    assert environment["cpu_isa"]["emulated"] == "Haswell"
    assert environment["cpu_isa"]["kernels"] == "AVX2 without VNNI"
    assert environment["cpu"].startswith("Intel Core Processor (Haswell) (emulated by QEMU")
    assert Run.open(runs / "haswell").manifest.command[:2] == ["qconsist", "run"]
    assert Run.open(runs / "native").manifest.environment["cpu_isa"]["kernels"] == NATIVE.kernels
    diff = CliRunner().invoke(app, ["diff", str(runs / "native"), str(runs / "haswell")])
    where = f"native {NATIVE.model}"
    cause = (f"cause: ran different CPU kernels: {NATIVE.kernels} vs AVX2 without VNNI (float {NATIVE.float_kernels} "
             f"vs FMA3 (NCHWc 8); {where} vs emulated Haswell); the artifacts, calibration, options and versions are "
             "the same and the final outputs diverge")
    if DIFFERS:
        assert diff.exit_code == 1
        assert cause in diff.output.splitlines()
        assert "final outputs: 2/2 samples differ, greatest abs difference 13.25" in diff.output
    else:
        assert "cause:" not in diff.output


@pytest.mark.slow
def test_locate_cpu_names_the_origin_and_recommends_the_pin_with_its_cost(saturating, tmp_path):
    out = CliRunner().invoke(app, ["locate", str(saturating["model"]), "--inputs", str(saturating["inputs"]),
                                   "--ep", "cpu", "--isa", "native,haswell", "--runs-dir", str(tmp_path / "runs"),
                                   "--run-id", "loc", "--timed-runs", "5", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert result["schema"] == "qconsist.locate-cpu/1"
    assert result["instruction_sets"]["Haswell"]["kernels"] == "AVX2 without VNNI"
    assert result["identical"] == {"default": not DIFFERS, "x64quantprecision": True, "disable_quant_qdq": True}
    assert result["recommended"] == ("x64quantprecision" if DIFFERS else "default")
    assert set(result["cost"]) == {"default", "x64quantprecision", "disable_quant_qdq"} and result["cost"]["default"] == 1.0
    assert all(ms > 0 for ms in result["native_ms"].values())
    haswell = next(c for c in result["cells"] if c["isa"] == "Haswell" and c["setting"] == "default")
    if DIFFERS:  # the fused QLinearConv computed otherwise from bit-identical inputs
        assert haswell["differing_samples"] == 2 and haswell["greatest_abs"] == 13.25
        assert len(haswell["origins"]) == 1 and "QLinearConv" in haswell["origins"][0]
        assert result["emulated_seconds"]["Haswell"] > 0
        diff = CliRunner().invoke(app, ["diff", str(tmp_path / "runs" / "loc-native-default"), haswell["run_dir"]])
        assert "the same and the tensors and final outputs diverge" in diff.output
        # the command that captures the raw tensors repeats the emulated run under the same processor
        assert [line for line in diff.output.splitlines() if "--dump --raw" in line][1].count("--isa Haswell") == 1
    text = CliRunner().invoke(app, ["locate", str(saturating["model"]), "--inputs", str(saturating["inputs"]),
                                    "--ep", "cpu", "--isa", "native,haswell", "--runs-dir", str(tmp_path / "runs"),
                                    "--run-id", "loc2", "--timed-runs", "5"])
    lines = text.output.splitlines()
    assert text.exit_code == 0, text.output
    assert f"model {saturating['model']}: 2 samples, 1 intra-op thread(s), CPU EP" in lines
    if DIFFERS:
        assert [line for line in lines if line.startswith("recommendation: ")][0].startswith(
            "recommendation: session.x64quantprecision=1: final outputs bit-identical on native, Haswell; cost here ")
        assert "  run with: --session-config session.x64quantprecision=1" in lines


def test_locate_cpu_compares_two_instruction_sets_or_says_so(saturating):
    out = CliRunner().invoke(app, ["locate", str(saturating["model"]), "--inputs", str(saturating["inputs"]),
                                   "--ep", "cpu", "--isa", "native"])
    assert out.exit_code == 2
    assert out.output.strip().splitlines()[-1] == (
        "error: --isa names one instruction set: locate --ep cpu compares two or more, e.g. native,haswell")
    out = CliRunner().invoke(app, ["locate", str(saturating["model"]), "--inputs", str(saturating["inputs"]),
                                   "--ep", "cuda", "--isa", "haswell"])
    assert out.exit_code == 2
    assert out.output.strip().splitlines()[-1] == (
        "error: --isa chooses the instruction sets of --ep cpu; the GPU matrix runs on this machine's GPU")


@pytest.mark.slow
def test_calib_repeat_isa_says_whether_the_md5_depends_on_the_calibrating_machine(small_models):
    out = CliRunner().invoke(app, ["calib", "repeat", str(small_models["classifier"]), "--inputs",
                                   str(small_models["arrays"]), "--isa", "native,haswell", "--json"])
    result = json.loads(out.output)
    assert [r["isa"] for r in result["runs"]] == ["native", "Haswell"]
    assert result["runs"][1]["float_kernels"] == "FMA3 (NCHWc 8)"
    # measured here: the classifier's ranges are the same under both float kernels
    assert out.exit_code == 0 and result["agree"] is True and result["differences"] == []
    assert result["verdict"].startswith("the quantized md5 does not depend on the calibrating instruction set: ")


@pytest.fixture(scope="module")
def saturating_pipeline(tmp_path_factory):
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    folder = tmp_path_factory.mktemp("isa-pipeline")
    saturating_float_model(folder / "float.onnx")
    saturating_inputs(folder / "data.npy", 8)
    (folder / "p.toml").write_text('name = "sat"\n[model]\nonnx = "float.onnx"\n[calibration]\ndata = "data.npy"\n'
                                   'count = 4\nrepeat = 2\n[quantize]\nper_channel = true\n'
                                   '[evaluation]\ndata = "data.npy"\noffset = 4\ncount = 4\n')
    return run_pipeline(load_pipeline(folder / "p.toml"), runs_dir=folder / "runs", run_id="sat").path


@pytest.mark.slow
def test_the_gate_fails_a_verdict_within_the_spread_and_the_pin_holds(saturating_pipeline, tmp_path):
    policy = tmp_path / "isa.toml"
    policy.write_text('[drift.float]\nmin_sqnr_db = 30.0\n[isa]\nspread = ["haswell"]\n')
    out = CliRunner().invoke(app, ["gate", str(saturating_pipeline), "--policy", str(policy), "--json"])
    check = next(c for c in json.loads(out.output)["checks"] if c["name"] == "isa.spread")
    here = f"native {NATIVE.kernels}"
    sqnr = check["measured"]["figures"][0]["values"]  # qconsist.pipeline.isaspread.FigureSpread
    assert check["measured"]["figures"][0]["label"] == "y SQNR" and sqnr[here] > 30.0  # 50.01 dB natively (VNNI)
    if DIFFERS:  # 0.50 dB on Haswell
        assert out.exit_code == 1 and check["status"] == "fail" and sqnr["Haswell"] < 1.0
        assert check["message"].startswith(
            f"the verdict depends on the instruction set: y SQNR {sqnr[here]:.2f} dB vs floor 30 dB, within the "
            f"instruction-set spread {sqnr[here] - sqnr['Haswell']:.2f} dB ({here} {sqnr[here]:.2f} dB, Haswell "
            f"{sqnr['Haswell']:.2f} dB): the verdicts differ between them; [isa] pin = true")
    policy.write_text('[drift.float]\nmin_sqnr_db = 30.0\n[isa]\nspread = ["haswell"]\npin = true\n')
    out = CliRunner().invoke(app, ["gate", str(saturating_pipeline), "--policy", str(policy), "--json"])
    check = next(c for c in json.loads(out.output)["checks"] if c["name"] == "isa.spread")
    assert check["status"] == "pass" and check["measured"]["identical"] == {"Haswell": True}
    assert check["message"].startswith("drift.float's verdict holds on native, Haswell: with session.x64quantprecision=1")
    assert out.exit_code == 0, out.output
    # without [isa] spread the check is not there: other policies' verdicts keep their checks
    out = CliRunner().invoke(app, ["gate", str(saturating_pipeline), "--json"])
    assert "isa.spread" not in [c["name"] for c in json.loads(out.output)["checks"]]


def test_a_policy_reads_isa():
    from qconsist.errors import ConfigError
    from qconsist.gate.policy import parse_policy

    policy = parse_policy('[isa]\nspread = ["Haswell", "Nehalem"]\npin = true\n')
    assert policy.isa.spread == ("Haswell", "Nehalem") and policy.isa.pin is True
    assert policy.to_json()["isa"] == {"spread": ["Haswell", "Nehalem"], "pin": True}
    with pytest.raises(ConfigError, match=r"policy: \[isa\]: unknown key\(s\) spred; known: pin, spread"):
        parse_policy('[isa]\nspred = ["Haswell"]\n')
    with pytest.raises(ConfigError, match=r"policy: \[isa\]: 'pin' must be true or false, got 'yes'"):
        parse_policy('[isa]\npin = "yes"\n')


def test_env_shows_the_instruction_set_and_the_integer_path():
    out = CliRunner().invoke(app, ["env"])
    lines = out.output.splitlines()
    assert out.exit_code == 0
    assert next(line for line in lines if line.startswith("instruction set")).startswith(
        f"instruction set       {NATIVE.kernels} (native; {NATIVE.vendor}; from cpuid): ")
    assert f"integer path          {NATIVE.integer_path}" in lines
    assert json.loads(CliRunner().invoke(app, ["env", "--json"]).output)["fingerprint"]["cpu_isa"] == NATIVE.to_json()
    assert os.environ.get("QCONSIST_EMULATED_CPU") is None


# --- --isa on every command that runs a model; the one QEMU worker ----------------------------------------------

MISSING_QEMU = ("error: --isa runs the model under QEMU user mode, and qemu-x86_64 is not installed: install the "
                "qemu-user package (apt-get install qemu-user; `make qemu` does it)")


def _commands_that_run_a_model(saturating) -> dict[str, list[str]]:
    """Each command that runs a model's session, with arguments it takes (the paths are checked after --isa)."""
    folder = saturating["folder"]
    return {"quant-error": ["quant-error", str(folder / "runs" / "sat")],
            "sensitivity": ["sensitivity", str(folder / "runs" / "sat")],
            "explain": ["explain", str(folder / "runs" / "a"), str(folder / "runs" / "b")]}


@pytest.mark.parametrize("command", ["quant-error", "sensitivity", "explain"])
def test_isa_on_a_command_that_runs_a_model_exits_3_without_qemu_and_2_for_an_unknown_model(command, saturating, tmp_path,
                                                                                         monkeypatch):
    args = _commands_that_run_a_model(saturating)[command]
    out = CliRunner().invoke(app, [*args, "--isa", "pentium9"])
    assert out.exit_code == 2, out.output
    line = out.output.strip().splitlines()[-1]
    assert line.startswith("error: --isa 'pentium9' is not a CPU model QEMU knows: use native or one of ")
    assert ", Haswell, " in line and ", Nehalem, " in line
    monkeypatch.setenv("PATH", str(tmp_path))  # no qemu-x86_64 on it
    out = CliRunner().invoke(app, [*args, "--isa", "haswell"])
    assert out.exit_code == 3, out.output
    assert out.output.strip().splitlines()[-1] == MISSING_QEMU


def test_the_worker_calls_only_module_level_functions_of_qconsist():
    from qconsist.emulation import _reference, main

    from qconsist.inference.emulated import compute_outputs

    assert _reference(compute_outputs) == "qconsist.inference.emulated:compute_outputs"
    with pytest.raises(ValueError, match="call_on calls a module-level function of qconsist in the child"):
        _reference(json.loads)
    with pytest.raises(ValueError, match="call_on calls a module-level function of qconsist in the child"):
        _reference(lambda request: request)
    assert main(["json:loads"]) == 2  # the child refuses what is not qconsist's


@pytest.mark.slow
def test_a_failure_in_the_emulated_child_keeps_its_line_and_exit_code(tmp_path):
    from qconsist.emulation import EmulatedChildError, call_under
    from qconsist.errors import QconsistError
    from qconsist.inference.emulated import compute_outputs

    request = {"model": str(tmp_path / "gone.onnx"), "arrays": str(tmp_path / "gone.npz"), "input_name": "x",
               "options": ExecutionOptions(intra_op_threads=1).to_json(), "output": str(tmp_path / "out.npz")}
    with pytest.raises(QconsistError) as here:
        compute_outputs(request)
    with pytest.raises(EmulatedChildError) as raised:
        call_under("Haswell", compute_outputs, request, what="the model's outputs")
    assert raised.value.exit_code == here.value.exit_code == 2
    assert str(raised.value) == f"the model's outputs under emulated Haswell failed (exit 2): error: {here.value}"


def _final_line(output: str, tensor: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(f"final output {tensor}: "))


@pytest.mark.slow
def test_quant_error_isa_records_the_processor_and_its_figure_follows_the_integer_path(saturating_pipeline):
    common = ["quant-error", str(saturating_pipeline), "--threads", "1"]
    pin = ["--session-config", "session.x64quantprecision=1"]
    native = CliRunner().invoke(app, common)
    native_pinned = json.loads(CliRunner().invoke(app, [*common, *pin, "--json"]).output)
    haswell = CliRunner().invoke(app, [*common, "--isa", "haswell"])
    assert haswell.exit_code == 0, haswell.output
    lines = haswell.output.splitlines()
    assert lines[0].startswith("emulating Haswell under QEMU ") and "emulation is slow" in lines[0]
    assert lines[-1].startswith("emulated Haswell: the command took ") and lines[-1].endswith(" s under QEMU (exit 0)")
    assert "instruction set: AVX2 without VNNI (emulated Haswell under QEMU " in haswell.output
    assert f"instruction set: {NATIVE.describe()}" in native.output.splitlines()
    # the saturating u8·s8 sums: measured 50.01 dB natively (VNNI), 0.50 dB under Haswell
    assert (_final_line(haswell.output, "y") != _final_line(native.output, "y")) is DIFFERS
    if DIFFERS:
        assert _final_line(haswell.output, "y").startswith("final output y: SQNR 0.50 dB, ")
    # with the exact u8·u8 path the emulated figure is the native one, to the last bit
    pinned = CliRunner().invoke(app, [*common, *pin, "--isa", "haswell", "--json"])
    assert pinned.exit_code == 0, pinned.output
    result = json.loads(pinned.output)
    assert result["instruction_set"]["emulated"] == "Haswell" and result["instruction_set"]["kernels"] == "AVX2 without VNNI"
    assert native_pinned["instruction_set"] == NATIVE.to_json()
    assert [(o["tensor"], o["sqnr_db"]) for o in result["outputs"]] == \
        [(o["tensor"], o["sqnr_db"]) for o in native_pinned["outputs"]]
    assert native_pinned["outputs"][0]["sqnr_db"] > 50.0


@pytest.mark.slow
def test_sensitivity_isa_records_the_emulated_processor_in_its_run(saturating_pipeline, tmp_path):
    common = ["sensitivity", str(saturating_pipeline), "--threads", "1", "--timed-runs", "3", "--warmup", "1",
              "--runs-dir", str(tmp_path / "runs"), "--json"]
    native = json.loads(CliRunner().invoke(app, [*common, "--run-id", "native"]).output)
    out = CliRunner().invoke(app, [*common, "--run-id", "haswell", "--isa", "haswell"])
    assert out.exit_code == 0, out.output
    haswell = json.loads(out.output)
    assert haswell["instruction_set"]["emulated"] == "Haswell" and native["instruction_set"] == NATIVE.to_json()
    environment = Run.open(tmp_path / "runs" / "haswell").manifest.environment
    assert environment["cpu_isa"]["emulated"] == "Haswell" and environment["cpu_isa"]["kernels"] == "AVX2 without VNNI"
    assert Run.open(tmp_path / "runs" / "haswell").manifest.command[:2] == ["qconsist", "sensitivity"]
    # the same quantized model (the run's recorded ranges), measured otherwise: 50.01 dB natively, 0.50 under Haswell
    assert haswell["baseline_md5"] == native["baseline_md5"] == native["run_md5"]
    worst = haswell["baseline"]["worst_sqnr_db"], native["baseline"]["worst_sqnr_db"]
    assert (worst[0] != worst[1]) is DIFFERS
    if DIFFERS:
        assert worst[0] < 1.0 < 50.0 < worst[1]


@pytest.mark.slow
def test_explain_runs_emulated_runs_under_the_processor_they_were_made_on(saturating, tmp_path):
    runs = tmp_path / "runs"
    common = ["run", str(saturating["model"]), "--inputs", str(saturating["inputs"]), "--threads", "1", "--dump",
              "--runs-dir", str(runs), "--isa", "haswell"]
    for run_id, level, quiet in (("disable", "disable", []), ("all", "all", ["-q"])):
        out = CliRunner().invoke(app, [*quiet, *common, "--run-id", run_id, "--level", level])
        assert out.exit_code == 0, out.output
        assert ("emulating Haswell under QEMU" in out.output) is not bool(quiet)  # -q: only errors on stderr
    here = CliRunner().invoke(app, ["explain", str(runs / "disable"), str(runs / "all")])
    assert here.exit_code == 2
    assert here.output.strip().splitlines()[-1].endswith(
        "explain re-runs the model, so run it under the processor they were made on: --isa Haswell")
    out = CliRunner().invoke(app, ["explain", str(runs / "disable"), str(runs / "all"), "--isa", "haswell"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert next(line for line in lines if line.startswith("instruction set: ")).startswith(
        "instruction set: AVX2 without VNNI (emulated Haswell under QEMU ")
    assert "responsible: QDQS8ToU8Transformer" in lines and "verdict: explained" in lines
    check = next(line for line in lines if line.startswith("  check it: "))
    assert check.count("--isa Haswell") == 1
