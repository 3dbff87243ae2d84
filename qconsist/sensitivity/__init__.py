"""From blame to fix: per-node sensitivity of a quantization and a verified list of nodes to keep in float.

For a pipeline run (``sensitivity(run, SensitivityRequest(...))``, ``qconsist sensitivity RUN``):

1. **one calibration**: the ranges the run recorded (``quantize/calibration_ranges.json``) are reused by every
   probe, through the pipeline's own ``quantize_model`` — probes differ only in the nodes they keep in float;
   the all-quantized probe reproduces the run's quantized model byte for byte;
2. **a first pass**: ``quant-error``'s per-node error (what each node loses, observed as ORT runs it) ranks
   the quantizable nodes cheaply;
3. **probes**: the top K of that ranking (``--all``: every quantizable node), each kept in float alone,
   quantized, run on the probe inputs as production runs them and judged against the float model (every output
   and part by its kind; top-1 of class scores; accuracy with labels) — the ranking by effect on the outputs;
4. **a proposal** for the targets (``qconsist.sensitivity.search``: forward selection in the order of the
   single-node effects, backward elimination; 1-minimal, measured at every step), with 16-bit activations
   measured as the alternative where keeping nodes in float cannot reach the targets;
5. **verification**: the proposal re-made by the pipeline's quantize stage (its code, calibration included),
   run and judged again — the measured figures beside the predicted ones — and its latency cost, the float,
   all-quantized and proposed models timed side by side on the chosen execution provider.

``SensitivityResult`` (schema ``qconsist.sensitivity/1``) holds it all, with the cost in sessions and seconds.
The run is read in one place, ``source.py``.
"""

from qconsist.sensitivity.analysis import RESULT_FILE, SensitivityRequest, sensitivity
from qconsist.sensitivity.figures import Figures, OutputFigures
from qconsist.sensitivity.result import SCHEMA, Latency, Proposal, SensitivityResult, Verification
from qconsist.sensitivity.target import Measure, Target, parse_targets

__all__ = [
    "Figures", "Latency", "Measure", "OutputFigures", "Proposal", "RESULT_FILE", "SCHEMA", "SensitivityRequest",
    "SensitivityResult", "Target", "Verification", "parse_targets", "sensitivity",
]
