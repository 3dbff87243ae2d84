"""GateVerdict: passed/bool, reasons, JSON round trip with schema, JUnit XML, markdown."""

import math
from xml.etree import ElementTree as ET

import pytest

from qconsist.errors import RunStoreError
from qconsist.gate import CheckResult, CheckStatus, GateVerdict, Policy


def _verdict(fail: bool) -> GateVerdict:
    checks = [
        CheckResult("artifacts", CheckStatus.FAIL if fail else CheckStatus.PASS,
                    "stage 'quantize' changed" if fail else "every stage's md5 matches", {"hash": "md5"}, {"changed": []}),
        CheckResult("drift.float", CheckStatus.PASS, "greatest absolute difference 0.007", {"max_abs_diff": 0.05},
                    {"max_abs_diff": 0.007, "max_rel_diff": math.inf}),
        CheckResult("gpu.pinned", CheckStatus.NOT_APPLICABLE, "no GPU recommendation to enforce: no CUDA GPU"),
    ]
    return GateVerdict(model="m", candidate="runs/b", baseline="runs/a", policy=Policy().to_json(), checks=checks,
                       created="2026-11-21T00:00:00Z", changed_stages=["quantize"] if fail else [],
                       first_diverging_node="conv1" if fail else None, origin_nodes=["conv1"] if fail else [])


def test_pass_and_fail():
    assert _verdict(False).passed and bool(_verdict(False))
    failed = _verdict(True)
    assert not failed.passed and not bool(failed)
    assert failed.reasons == ["artifacts: stage 'quantize' changed"]
    assert failed.summary() == "FAIL m: 1 of 3 checks failed"


def test_json_round_trip_keeps_everything():
    verdict = _verdict(True)
    data = verdict.to_json()
    assert data["schema"] == "qconsist.gate/1" and data["passed"] is False
    assert data["checks"][1]["measured"]["max_rel_diff"] == "inf"  # JSON has no Inf
    again = GateVerdict.from_json(data)
    assert again.to_json() == data
    assert again.check("gpu.pinned").status is CheckStatus.NOT_APPLICABLE


def test_from_json_refuses_other_schemas():
    with pytest.raises(RunStoreError, match=r"not a gate verdict of schema 'qconsist.gate/1' \(found 'qconsist.run/1'\)"):
        GateVerdict.from_json({"schema": "qconsist.run/1"})
    with pytest.raises(RunStoreError, match=r"gate verdict is malformed"):
        GateVerdict.from_json({"schema": "qconsist.gate/1", "model": "m"})


def test_junit_xml():
    root = ET.fromstring(_verdict(True).to_junit())
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert cases["artifacts"].find("failure").get("message") == "stage 'quantize' changed"
    assert cases["gpu.pinned"].find("skipped") is not None
    assert cases["drift.float"].find("failure") is None


def test_markdown():
    text = _verdict(True).to_markdown()
    assert text.startswith("## Release gate: ❌ FAIL — m")
    assert "1. artifacts: stage 'quantize' changed" in text
    assert "- first diverging node: `conv1` (origin nodes: `conv1`)" in text
    assert "| gpu.pinned | not_applicable | no GPU recommendation to enforce: no CUDA GPU |" in text


def test_markdown_escapes_names_and_messages_as_html_and_junit_do():
    """A model or node named with HTML or a table's ``|`` (issue 29, item 12): shown as it is, never as markup."""
    hostile = "<script>alert('x')</script>|1"
    checks = [CheckResult("artifacts", CheckStatus.FAIL, f"stage 'quantize' of {hostile} changed", {"hash": "md5"}, {}),
              CheckResult("drift.float", CheckStatus.PASS, "a | b <b>bold</b> *x* [l](u)", {}, {})]
    verdict = GateVerdict(model=hostile, candidate="runs/<b>", baseline=None, policy=Policy().to_json(), checks=checks,
                          created="2026-11-21T00:00:00Z", first_diverging_node="<img src=x onerror=alert(1)>",
                          origin_nodes=["conv`1"])
    text = verdict.to_markdown()
    assert "<script" not in text and "<img" not in text and "<b>" not in text
    lines = text.splitlines()
    assert lines[0] == "## Release gate: ❌ FAIL — &lt;script&gt;alert('x')&lt;/script&gt;\\|1"
    assert "- candidate: <code>runs/&lt;b&gt;</code>" in lines
    assert "- first diverging node: <code>&lt;img src=x onerror=alert(1)&gt;</code> (origin nodes: <code>conv\\`1</code>)" in lines
    assert lines[-2] == ("| artifacts | fail | stage 'quantize' of &lt;script&gt;alert('x')&lt;/script&gt;\\|1 changed |")
    assert lines[-1] == "| drift.float | pass | a \\| b &lt;b&gt;bold&lt;/b&gt; \\*x\\* \\[l\\](u) |"
    root = ET.fromstring(verdict.to_junit())  # the JUnit output keeps the same text, escaped by XML
    assert root.find("testsuite").get("name") == f"gate.{hostile}"
