"""``qconsist gate``: pass or fail a candidate against its baseline under a policy, with every reason."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED, EXIT_OK


def render_verdict(verdict) -> None:  # GateVerdict
    console = stdout_console()
    console.print(("PASS" if verdict.passed else "FAIL") + f" {verdict.model}: {verdict.candidate}")
    console.print(f"  baseline: {verdict.baseline or 'none'}; policy: {verdict.policy.get('source')}")
    if verdict.changed_stages:
        console.print(f"  stages changed: {', '.join(verdict.changed_stages)}")
    if verdict.first_diverging_node:
        console.print(f"  first diverging node: {verdict.first_diverging_node} (origin nodes: {', '.join(verdict.origin_nodes) or 'none'})")
    for check in verdict.checks:
        console.print(f"  {check.status.value.upper():<14} {check.name}: {check.message}")
    failed = [check.name for check in verdict.checks if check.failed]
    passed = sum(1 for check in verdict.checks if check.status.value == "pass")
    console.print(f"FAIL {verdict.model}: {len(failed)} check(s) failed: {', '.join(failed)}" if failed else
                  f"PASS {verdict.model}: {passed} checks passed, {len(verdict.checks) - passed} not applicable")


def gate(
    run: Path = typer.Argument(..., help="Candidate: a pipeline run or a nightly entry run directory."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Baseline run of the same kind (omit: first release, nothing to compare)."),
    policy: opt.told(opt.PolicyFile, "Policy file (TOML; default: the built-in defaults, see policies/default.toml): the checks and their tolerances.") = None,
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write the verdict as JUnit XML to this file."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write a markdown summary to this file."),
    json_output: opt.Json = False,
    force: opt.Force = False,
) -> None:
    """Judge RUN against --baseline under --policy: artifact hashes, repeated calibration and inference,
    output drift against the float model and the baseline, NaN/Inf, labels, the pinned GPU config.

    Exit 0: pass; 1: fail (every reason listed); 2: error.
    """
    from qconsist.gate import evaluate_gate, load_policy
    from qconsist.store.outputs import check_output, write_output

    inputs = [p for p in (run, baseline, policy) if p is not None]
    for output in (junit, markdown):  # refused before the gate runs
        if output is not None:
            check_output(output, inputs, force)
    verdict = evaluate_gate(run, baseline, load_policy(policy), progress=progress_for(json_output))
    if junit is not None:
        write_output(junit, verdict.to_junit(), inputs, force)
    if markdown is not None:
        write_output(markdown, verdict.to_markdown(), inputs, force)
    if json_output:
        print_json(verdict)
    else:
        render_verdict(verdict)
    raise typer.Exit(EXIT_OK if verdict.passed else EXIT_DIVERGED)
