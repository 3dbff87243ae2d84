"""The gate's verdict: every check with its status, tolerance and measured figures; JUnit XML and markdown.

Schema ``qconsist.gate/1``. A verdict passes when no check failed; a check that could not apply says why
(``not_applicable`` with its reason), so nothing is silently skipped.
"""

from __future__ import annotations

import html
import re

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from xml.etree import ElementTree as ET

from qconsist.errors import RunStoreError
from qconsist.store.serde import serialized

GATE_SCHEMA = "qconsist.gate/1"


class CheckStatus(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "not_applicable"


_MARKDOWN = re.compile(r"([\\`*\[\]|])")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_./:+=,@ -]*")


def markdown_text(text: object) -> str:
    """``text`` on one line of markdown, shown as it is: HTML's ``& < >`` as entities, and the characters that
    would start markup or end a table cell (``\\ ` * [ ] |``) escaped."""
    flat = " ".join(str(text).split())
    return _MARKDOWN.sub(r"\\\1", html.escape(flat, quote=False))


def markdown_code(text: object) -> str:
    """``text`` as inline code: a backtick span for plain names, else an HTML ``<code>`` of the escaped text (a
    backtick span cannot hold every string, and shows entities as they are)."""
    flat = " ".join(str(text).split())
    if _PLAIN_NAME.fullmatch(flat):
        return f"`{flat}`"
    return f"<code>{markdown_text(flat)}</code>"


@dataclass(frozen=True)
class CheckResult:
    """One gate check: ``name`` (dotted, e.g. ``drift.float``), its status and one line saying why."""

    name: str
    status: CheckStatus
    message: str
    tolerance: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status is CheckStatus.FAIL

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "status": self.status.value, "message": self.message,
            "tolerance": _finite(self.tolerance), "measured": _finite(self.measured),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckResult":
        return cls(
            name=data["name"], status=CheckStatus(data["status"]), message=data["message"],
            tolerance=dict(data.get("tolerance", {})), measured=dict(data.get("measured", {})),
        )


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@serialized(
    schema=GATE_SCHEMA, derived=("passed", "reasons"), error=RunStoreError,
    refused="not a gate verdict of schema {schema!r} (found {found!r})",
    malformed="gate verdict is malformed: {exc!r}",
)
@dataclass
class GateVerdict:
    """Pass or fail, with every reason. ``bool(verdict)`` is ``verdict.passed``."""

    model: str
    candidate: str
    baseline: str | None
    policy: dict[str, Any]
    checks: list[CheckResult]
    created: str = ""
    changed_stages: list[str] = field(default_factory=list)
    first_diverging_node: str | None = None
    origin_nodes: list[str] = field(default_factory=list)
    diff: dict[str, Any] | None = None  # ``qconsist diff`` result of the candidate's dump against the baseline's
    same_run: bool = False  # the baseline was the candidate's own run (the ``baseline`` check fails)

    @property
    def passed(self) -> bool:
        return not any(check.failed for check in self.checks)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def reasons(self) -> list[str]:
        """One line per failed check."""
        return [f"{check.name}: {check.message}" for check in self.checks if check.failed]

    def check(self, name: str) -> CheckResult:
        for item in self.checks:
            if item.name == name:
                return item
        raise KeyError(name)

    def summary(self) -> str:
        failed = len(self.reasons)
        if self.passed:
            return f"PASS {self.model}: {len(self.checks)} checks, none failed"
        return f"FAIL {self.model}: {failed} of {len(self.checks)} checks failed"

    def to_markdown(self) -> str:
        """The verdict as a GitHub comment. Names and messages come from models and files (hostile ones too): they
        are escaped as the HTML page and JUnit escape them (``markdown_text``, ``markdown_code``)."""
        head = "✅ PASS" if self.passed else "❌ FAIL"
        lines = [
            f"## Release gate: {head} — {markdown_text(self.model)}",
            "",
            f"- candidate: {markdown_code(self.candidate)}",
            f"- baseline: {markdown_code(self.baseline or 'none')}",
            f"- policy: {markdown_code(self.policy.get('source', ''))}",
        ]
        if self.changed_stages:
            lines.append(f"- stages changed against the baseline: {', '.join(markdown_text(s) for s in self.changed_stages)}")
        if self.first_diverging_node:
            origins = ", ".join(markdown_code(n) for n in self.origin_nodes) or "none"
            lines.append(f"- first diverging node: {markdown_code(self.first_diverging_node)} (origin nodes: {origins})")
        if self.reasons:
            lines += ["", "### Reasons", ""] + [f"1. {markdown_text(reason)}" for reason in self.reasons]
        lines += ["", "| check | status | detail |", "| --- | --- | --- |"]
        for check in self.checks:
            lines.append(f"| {markdown_text(check.name)} | {check.status.value} | {markdown_text(check.message)} |")
        return "\n".join(lines) + "\n"

    def to_junit(self) -> str:
        """JUnit XML: one test suite for the model, one test case per check."""
        failures = sum(1 for c in self.checks if c.failed)
        skipped = sum(1 for c in self.checks if c.status is CheckStatus.NOT_APPLICABLE)
        suites = ET.Element("testsuites", name="qconsist gate", tests=str(len(self.checks)), failures=str(failures))
        suite = ET.SubElement(
            suites, "testsuite", name=f"gate.{self.model}", tests=str(len(self.checks)),
            failures=str(failures), skipped=str(skipped), errors="0", timestamp=self.created,
        )
        props = ET.SubElement(suite, "properties")
        for key, value in (("candidate", self.candidate), ("baseline", self.baseline or ""), ("policy", self.policy.get("source", ""))):
            ET.SubElement(props, "property", name=key, value=str(value))
        for check in self.checks:
            case = ET.SubElement(suite, "testcase", classname=f"gate.{self.model}", name=check.name)
            if check.failed:
                failure = ET.SubElement(case, "failure", message=check.message, type="GateCheckFailed")
                failure.text = f"{check.message}\ntolerance: {check.tolerance}\nmeasured: {check.measured}"
            elif check.status is CheckStatus.NOT_APPLICABLE:
                ET.SubElement(case, "skipped", message=check.message)
            out = ET.SubElement(case, "system-out")
            out.text = check.message
        ET.indent(suites)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
