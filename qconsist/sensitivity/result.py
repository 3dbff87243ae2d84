"""What a sensitivity analysis found, as objects: the ranking, the proposal, its verification, the latency cost
and what it all cost (``SensitivityResult``, schema ``qconsist.sensitivity/1``, ``passed``, ``to_json`` /
``from_json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from qconsist.errors import RunStoreError
from qconsist.sensitivity.figures import Figures
from qconsist.sensitivity.target import Target
from qconsist.store.serde import serialized

SCHEMA = "qconsist.sensitivity/1"


@dataclass
class FirstPass:
    """quant-error's figure for a node: the SQNR of the tensor it stands for and what the node loses there."""

    tensor: str
    sqnr_db: float
    added_db: float | None = None


@dataclass
class NodeSensitivity:
    """One quantizable node: quant-error's first-pass figure, and, when it was probed, the figures of the model
    with this node alone kept in float."""

    node: str
    op_type: str
    first_pass: FirstPass | None = None
    first_pass_rank: int | None = None  # 1 = the node quant-error blames most
    probe: Figures | None = None
    md5: str = ""
    gain_db: float | None = None  # the worst output's SQNR gained against the all-quantized model
    rank: int | None = None  # by the effect on the final outputs (probed nodes only; 1 = most)
    same_model_as_baseline: bool = False  # keeping it in float changes nothing in the quantized model
    seconds: float = 0.0


@dataclass
class Agreement:
    """How quant-error's ranking relates to the probes' ranking over the probed nodes: Spearman's rank
    correlation of its added SQNR (and of its SQNR) with the gain, and how many of the probes' top ``top``
    nodes are in quant-error's top ``top``."""

    nodes: int
    spearman_added: float | None
    spearman_sqnr: float | None
    top: int
    overlap: int


@dataclass
class Step:
    """One probe of the search: what was in float, what it measured and what the search did with it."""

    action: str  # "add" | "skip" | "drop" | "keep" | "alternative"
    node: str
    excluded: list[str]
    figures: Figures
    met: bool


@dataclass
class Proposal:
    """The nodes to keep in float, the figures the search measured with them (the prediction), whether they reach
    the targets, how they were found and what that guarantees."""

    nodes: list[str]
    predicted: Figures
    reached: bool
    method: str
    guarantee: str
    steps: list[Step] = field(default_factory=list)
    quantize_changes: dict[str, Any] = field(default_factory=dict)  # other [quantize] settings proposed (an alternative)
    md5: str = ""

    def pipeline_lines(self, existing: list[str]) -> list[str]:
        """The ``[quantize]`` lines to paste into the pipeline file (the run's own exclusions kept)."""
        lines = ["[quantize]"]
        for key, value in self.quantize_changes.items():
            lines.append(f"{key} = {json.dumps(value)}")
        nodes = [*existing, *self.nodes]
        if self.nodes:
            lines.append("nodes_to_exclude = [" + ", ".join(json.dumps(n) for n in nodes) + "]")
        return lines


@dataclass
class Verification:
    """The proposal re-made by the pipeline's quantize stage (calibration included) and measured again."""

    model: str  # the verified model, inside the sensitivity run directory (or a scratch path)
    md5: str
    same_as_predicted: bool  # byte-identical to the model the search measured
    measured: Figures
    reached: bool
    stage_check: dict[str, Any] | None = None  # the quantize stage's own check on the evaluation inputs (CPU)
    stage_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


@serialized(derived=("ratio", "float_ratio"))
@dataclass
class Latency:
    """Median latency of the float, all-quantized and proposed models on the chosen EP, timed side by side
    (interleaved runs), and the proposal's cost as a ratio to the all-quantized model."""

    provider: str
    runs: int
    warmup: int
    float_ms: float
    quantized_ms: float
    proposed_ms: float
    quantized_spread: float = 0.0
    proposed_spread: float = 0.0

    @property
    def ratio(self) -> float:
        return self.proposed_ms / self.quantized_ms if self.quantized_ms > 0 else float("nan")

    @property
    def float_ratio(self) -> float:
        return self.float_ms / self.quantized_ms if self.quantized_ms > 0 else float("nan")


@dataclass
class Cost:
    """Sessions, quantizations and seconds, by phase; the per-probe median and what bounds it."""

    sessions: int = 0
    quantizations: int = 0
    probes: int = 0
    reused: int = 0  # probes answered by a byte-identical model already measured
    seconds: dict[str, float] = field(default_factory=dict)  # first_pass, probes, search, verify, latency, total
    probe_parts: dict[str, float] = field(default_factory=dict)  # median seconds per probe: quantize, session, inference


@serialized(
    schema=SCHEMA, derived=("passed",), error=RunStoreError,
    refused="sensitivity result schema {found!r} is not {schema!r}",
    malformed="sensitivity result is malformed: {exc}",
)
@dataclass
class SensitivityResult:
    """A sensitivity analysis of a pipeline run (see ``qconsist.sensitivity``)."""

    run: str
    model: str
    float_stage: str
    execution: dict[str, Any]
    inputs: dict[str, Any]
    samples: int
    targets: list[Target]
    strategy: str  # which nodes were probed, and why
    quantizable: int  # nodes the quantizer may quantize, by name
    unnamed: int  # quantizable nodes without a name (cannot be excluded)
    baseline: Figures  # the run's own quantization, measured as the probes are
    baseline_md5: str
    run_md5: str  # the run's quantized model: equal to baseline_md5 when the recorded ranges reproduce it
    nodes: list[NodeSensitivity]  # every quantizable node; probed ones ranked first
    existing_exclusions: list[str] = field(default_factory=list)  # the run's own nodes_to_exclude
    agreement: Agreement | None = None
    proposal: Proposal | None = None
    verification: Verification | None = None
    latency: Latency | None = None
    alternatives: list[Step] = field(default_factory=list)  # other settings measured when keeping nodes in float fails
    cost: Cost = field(default_factory=Cost)
    labels: int = 0  # labelled samples among the inputs
    instruction_set: dict[str, Any] = field(default_factory=dict)  # where the sessions ran (qconsist.cpu.InstructionSet)

    @property
    def probed(self) -> list[NodeSensitivity]:
        return sorted((n for n in self.nodes if n.rank is not None), key=lambda n: n.rank)  # type: ignore[arg-type, return-value]

    @property
    def passed(self) -> bool:
        """No target: the ranking is the result (passed). With targets: the verified proposal reaches them."""
        if not self.targets:
            return True
        return self.verification is not None and self.verification.reached

    def __bool__(self) -> bool:
        return self.passed
