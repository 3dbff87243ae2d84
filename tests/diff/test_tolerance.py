"""``qconsist diff --atol/--rtol/--policy``: where two runs differ by more than a tolerance (exact stays the
default), checked against an independent numpy computation on the raw tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.compare.tolerance import Tolerance
from qconsist.diff import diff_runs
from qconsist.errors import ConfigError
from qconsist.gate.policy import parse_policy
from qconsist.inference.reader import load_dump
from qconsist.store.run import Run
from qconsist.diff.tensors import tensor_keys

runner = CliRunner()


def _greatest(run_a, run_b, key: str, space: str) -> float:
    """Independently: the greatest |b - a| of one tensor over the samples, from the raw archives."""
    dump_a, dump_b = load_dump(Run.open(run_a)), load_dump(Run.open(run_b))
    col_a, col_b = tensor_keys(dump_a, space)[key], tensor_keys(dump_b, space)[key]
    worst = 0.0
    for sample in range(dump_a.table.shape[0]):
        with np.load(run_a / "dump" / "raw" / f"{sample:06d}.npz") as a, np.load(run_b / "dump" / "raw" / f"{sample:06d}.npz") as b:
            worst = max(worst, float(np.abs(b[f"t{col_b}"].astype(np.float64) - a[f"t{col_a}"].astype(np.float64)).max()))
    return worst


def test_exact_is_the_default_and_tolerance_judges_each_node(level_runs):
    exact = diff_runs(level_runs["disable"], level_runs["extended"])
    assert exact.tolerance.exact and not exact.passed and exact.tensors.beyond == exact.tensors.nodes
    judged = diff_runs(level_runs["disable"], level_runs["extended"], Tolerance(atol=1.0))
    nodes = {n.key: n for n in judged.tensors.nodes}
    assert [n.key for n in judged.tensors.nodes] == [n.key for n in exact.tensors.nodes]  # the same divergence
    assert {n.tolerance for n in judged.tensors.nodes} <= {"beyond", "within", "unknown"}
    for node in judged.tensors.nodes:
        if node.elements is not None:  # raw kept in both runs: decided from the elements
            greatest = _greatest(level_runs["disable"], level_runs["extended"], node.key, judged.tensors.space)
            assert node.elements.max_abs == pytest.approx(greatest)
            tolerance = 1.0 + 0.0
            assert node.tolerance == ("beyond" if greatest > tolerance else "within"), (node.key, greatest)
    assert set(judged.tensors.raw_missing) == {n.key for n in judged.tensors.nodes if n.tolerance == "unknown"} | set(exact.tensors.raw_missing)
    assert judged.passed is False
    assert nodes  # there is something to judge


def test_fingerprints_prove_beyond_without_raw_tensors(level_runs):
    """A tolerance far below the differences: nodes without raw tensors are proven beyond from min/max/mean."""
    judged = diff_runs(level_runs["disable"], level_runs["extended"], Tolerance(atol=1e-12))
    without_raw = [n for n in judged.tensors.nodes if n.elements is None]
    assert without_raw and all(n.tolerance in ("beyond", "unknown") for n in without_raw)
    assert any(n.tolerance == "beyond" for n in without_raw)


def test_cli_tolerance_and_per_node_policy(level_runs, tmp_path):
    a, b = str(level_runs["disable"]), str(level_runs["extended"])
    result = runner.invoke(app, ["diff", a, b, "--atol", "1", "--json"])
    data = json.loads(result.stdout)
    assert result.exit_code == 1
    assert data["tolerance"] == {"atol": 1.0, "rtol": 0.0, "nodes": {}}
    assert data["tensors"]["beyond"] == [n["label"] for n in data["tensors"]["nodes"] if n["tolerance"] in ("beyond", "unknown")]
    text = runner.invoke(app, ["diff", a, b, "--atol", "1"]).stdout
    assert "tolerance: |b - a| <= atol 1 + rtol 0·|a|" in text
    assert "beyond the tolerance: " in text and " diverging node(s)" in text
    policy = tmp_path / "p.toml"
    policy.write_text('[diff]\natol = 1.0\n[diff.nodes]\n"*" = { atol = 1e9 }\n')
    loose = json.loads(runner.invoke(app, ["diff", a, b, "--policy", str(policy), "--json"]).stdout)
    assert loose["tolerance"]["nodes"] == {"*": {"atol": 1e9, "rtol": 0.0}}
    decided = [n for n in loose["tensors"]["nodes"] if n["elements"] is not None]
    assert decided and all(n["tolerance"] == "within" for n in decided)
    assert all(o["mismatched"] == 0 for o in loose["output_stats"])


def test_identical_runs_pass_with_a_tolerance(runs_identical):
    result = runner.invoke(app, ["diff", *runs_identical, "--atol", "0.5", "--rtol", "0.1"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "PASS — verdict: identical"
    assert "output prob: Mismatched elements: 0 / " in result.stdout


@pytest.fixture()
def runs_identical(level_runs):
    return str(level_runs["extended"]), str(level_runs["extended2"])


def test_tolerance_options_are_checked():
    with pytest.raises(ConfigError, match=r"atol must be a finite number >= 0, got -1"):
        Tolerance(atol=-1)
    with pytest.raises(ConfigError, match=r"\[diff\]: unknown key\(s\) tol; known: atol, nodes, rtol"):
        parse_policy("[diff]\ntol = 1\n", "p.toml")
    with pytest.raises(ConfigError, match=r"\[diff\].nodes: 'conv' must be a table with atol and/or rtol"):
        parse_policy('[diff.nodes]\nconv = 1\n', "p.toml")
    tolerance = parse_policy('[diff]\nrtol = 0.5\n[diff.nodes]\n"conv_*" = { atol = 2.0 }\n', "p.toml").diff
    assert tolerance.for_node("conv_1") == (2.0, 0.5) and tolerance.for_node("relu_1", "x") == (0.0, 0.5)
    assert Tolerance().exact and not tolerance.exact
