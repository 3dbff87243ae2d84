"""The release gate: a candidate against its baseline under an explicit policy; pass or fail with every reason."""

from qconsist.gate.gate import evaluate_gate
from qconsist.gate.policy import Policy, load_policy, parse_policy
from qconsist.gate.verdict import CheckResult, CheckStatus, GateVerdict

__all__ = ["CheckResult", "CheckStatus", "GateVerdict", "Policy", "evaluate_gate", "load_policy", "parse_policy"]

from qconsist.front import callable_package  # noqa: E402

callable_package(__name__)  # qconsist.gate(run, baseline): the top-level call (qconsist.api.gate)
