"""The configuration matrix: specs, defaults, TF32 pairs and NVIDIA_TF32_OVERRIDE."""

from __future__ import annotations

import pytest

from qconsist.errors import ConfigError
from qconsist.locate.config import (
    AlgoSearch, GpuConfig, Tf32Override, default_matrix, parse_matrix, tf32_pairs, timing_based,
)
from qconsist.locate.explore import gpu_variants


def test_default_matrix_is_search_times_tf32_with_ort_defaults_first():
    labels = [c.label for c in default_matrix()]
    assert labels == [
        "EXHAUSTIVE/tf32=1", "EXHAUSTIVE/tf32=0", "HEURISTIC/tf32=1", "HEURISTIC/tf32=0",
        "DEFAULT/tf32=1", "DEFAULT/tf32=0",
    ]


def test_variants_add_workspace_and_deterministic_configs():
    configs = default_matrix([AlgoSearch.HEURISTIC], [False], workspace_variants=True, deterministic_variants=True)
    assert [c.label for c in configs] == [
        "HEURISTIC/tf32=0", "HEURISTIC/tf32=0/workspace=0", "HEURISTIC/tf32=0/deterministic=1",
    ]


def test_spec_parsing_resolves_defaults_and_round_trips():
    cfg = GpuConfig.parse("heuristic/tf32=0/deterministic=1")
    assert cfg == GpuConfig(AlgoSearch.HEURISTIC, False, True, True)
    assert cfg.label == "HEURISTIC/tf32=0/deterministic=1"
    assert GpuConfig.parse(cfg.label) == cfg
    assert GpuConfig.from_json(cfg.to_json()) == cfg
    assert GpuConfig.parse("DEFAULT").label == "DEFAULT/tf32=1"


def test_execution_options_spell_every_cuda_setting():
    options = GpuConfig.parse("DEFAULT/tf32=0/workspace=0").execution_options()
    assert options.ort_providers()[0] == ("CUDAExecutionProvider", {
        "cudnn_conv_algo_search": "DEFAULT", "cudnn_conv_use_max_workspace": "0", "use_tf32": "0",
    })
    assert options.deterministic_compute is False
    assert options.to_json()["provider"] == "cuda"


@pytest.mark.parametrize("spec, message", [
    ("FASTEST", r"unknown cudnn_conv_algo_search 'FASTEST'; use one of EXHAUSTIVE, HEURISTIC, DEFAULT"),
    ("HEURISTIC/tf33=1", r"config 'HEURISTIC/tf33=1': unknown setting 'tf33=1'"),
    ("HEURISTIC/tf32=2", r"config 'HEURISTIC/tf32=2': tf32 must be 0 or 1, not '2'"),
    ("HEURISTIC/tf32=1/tf32=0", r"config 'HEURISTIC/tf32=1/tf32=0': tf32 is given twice"),
    ("  ", r"empty config spec"),
])
def test_bad_specs_are_refused(spec, message):
    with pytest.raises(ConfigError, match=message):
        GpuConfig.parse(spec)


def test_parse_matrix_splits_commas_and_drops_duplicates():
    configs = parse_matrix(["HEURISTIC/tf32=0,DEFAULT", "heuristic/tf32=0"])
    assert [c.label for c in configs] == ["HEURISTIC/tf32=0", "DEFAULT/tf32=1"]
    with pytest.raises(ConfigError, match="the configuration matrix is empty"):
        parse_matrix([" , "])


def test_tf32_pairs_and_comparisons():
    configs = default_matrix()
    assert [(a.label, b.label) for a, b in tf32_pairs(configs)] == [
        ("EXHAUSTIVE/tf32=1", "EXHAUSTIVE/tf32=0"), ("HEURISTIC/tf32=1", "HEURISTIC/tf32=0"),
        ("DEFAULT/tf32=1", "DEFAULT/tf32=0"),
    ]
    variants, comparisons = gpu_variants(configs)
    assert [v.timing_based for v in variants] == [True, True, False, False, False, False]
    described = [(c.reference, c.other, c.why) for c in comparisons]
    assert described[0] == ("EXHAUSTIVE/tf32=1", "EXHAUSTIVE/tf32=0", "tf32")
    assert ("EXHAUSTIVE/tf32=1", "HEURISTIC/tf32=1", "algorithm") in described
    assert ("HEURISTIC/tf32=1", "HEURISTIC/tf32=0", "tf32") in described
    assert len(described) == 7  # reference vs 5 others, plus the two other TF32 pairs
    assert timing_based(AlgoSearch.EXHAUSTIVE) and not timing_based(AlgoSearch.DEFAULT)


def test_tf32_override_is_read_and_explained(monkeypatch):
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    assert Tf32Override.from_environment().value is None
    assert "unset" in Tf32Override.from_environment().explanation()
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    override = Tf32Override.from_environment()
    assert override.disables_tf32
    assert override.explanation().startswith("NVIDIA_TF32_OVERRIDE=0 overrides use_tf32")
    assert override.to_json()["value"] == "0"
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "1")
    assert not Tf32Override.from_environment().disables_tf32
    assert "has no effect" in Tf32Override.from_environment().explanation()


def test_matrix_needs_search_and_tf32():
    with pytest.raises(ConfigError, match="needs at least one search mode and one TF32 setting"):
        default_matrix([], [True])
    with pytest.raises(ConfigError, match="GpuConfig.use_tf32 must be true, false or unset"):
        GpuConfig(AlgoSearch.DEFAULT, use_tf32=1)  # type: ignore[arg-type]


def test_a_config_is_overrides_on_execution_options_whose_defaults_are_resolved_once():
    from qconsist.inference.session import ExecutionOptions

    base = ExecutionOptions("cuda", {"device_id": 1}, graph_optimization_level="basic", intra_op_threads=2)
    applied = GpuConfig(AlgoSearch.HEURISTIC, use_tf32=False).apply(base)
    assert applied == ExecutionOptions("cuda", {"device_id": 1, "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False},
                                       graph_optimization_level="basic", intra_op_threads=2)
    # unset settings take onnxruntime's defaults from the one place they are declared
    assert (applied.setting("cudnn_conv_use_max_workspace"), applied.setting("deterministic_compute")) == (True, False)
    assert ExecutionOptions("cuda").setting("use_tf32") is True
    assert ExecutionOptions("cpu").setting("intra_op_threads") is None  # onnxruntime decides: one per core
    assert GpuConfig().resolved() == GpuConfig(AlgoSearch.EXHAUSTIVE, True, True, False)
    full = GpuConfig.parse("DEFAULT/deterministic=1").execution_options(base)
    assert full.intra_op_threads == 2 and full.option("device_id") == 1 and full.deterministic_compute is True
    with pytest.raises(ConfigError, match="^a GPU config applies to the cuda execution provider, not cpu$"):
        GpuConfig().apply(ExecutionOptions("cpu"))
    with pytest.raises(ConfigError, match="^execution provider cpu has no setting use_tf32$"):
        ExecutionOptions("cpu").setting("use_tf32")
