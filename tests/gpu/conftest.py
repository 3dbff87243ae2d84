"""Fixtures of the GPU-locate tests: open_nsfw's float and QDQ models and a real CPU exploration.

On the CPU, ``intra_op_threads`` 1 and 3 run some of open_nsfw's convolutions with another partition of
the work, which changes their last bits: a real configuration sensitivity with an identical graph, which
the engine of ``qconsist locate`` must find exactly as it finds cuDNN's on the GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def nsfw_models(nsfw_run) -> dict[str, Path]:
    from qconsist.inference.model import resolve_model

    return {
        "float": resolve_model(nsfw_run.path, "optimize").path,
        "qdq": resolve_model(nsfw_run.path, "quantize").path,
    }


@pytest.fixture(scope="session")
def photo_samples(nsfw_models) -> list:
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline

    config = load_pipeline(REPO / "pipelines" / "open_nsfw.toml")
    specs = input_specs(nsfw_models["qdq"])
    photos = open_input_set("package:photos", config.preprocess, specs[0].name).checked(specs)
    return [photos.sample(i) for i in range(4)]


@pytest.fixture(scope="session")
def cpu_threads_exploration(nsfw_models, photo_samples):
    """``explore`` on the QDQ model: variants threads=1 (reference) and threads=3, 2 sessions each."""
    from qconsist.locate.latency import LatencyOptions
    from qconsist.locate.explore import Comparison, Variant, explore
    from qconsist.inference.session import ExecutionOptions

    variants = [Variant("threads=1", ExecutionOptions(intra_op_threads=1)),
                Variant("threads=3", ExecutionOptions(intra_op_threads=3))]
    comparisons = [Comparison("threads=1", "threads=3", "algorithm")]
    reports, results, tagged, load, decision = explore(
        nsfw_models["qdq"], photo_samples[:2], variants, comparisons, repeats=2, latency=LatencyOptions(1, 5),
    )
    return {"variants": variants, "reports": reports, "results": results, "tagged": tagged, "decision": decision}
