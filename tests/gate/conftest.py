"""Real pipeline runs of open_nsfw for the gate tests: a baseline and a candidate calibrated on other photos."""

from __future__ import annotations

from pathlib import Path

import pytest

from qconsist.pipeline.config import parse_pipeline
from qconsist.pipeline.runner import run_pipeline

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def small_open_nsfw(calibration_offset: int) -> dict:
    """open_nsfw with 3 calibration photos (repeated twice) and 2 evaluation photos, to keep tests fast."""
    return {
        "name": "open_nsfw",
        "model": {"source": "open_nsfw"},
        "preprocess": {"resize": [256, 256], "crop": [224, 224], "channel_order": "BGR", "mean": [104.0, 117.0, 123.0]},
        "calibration": {"data": "package:photos", "offset": calibration_offset, "count": 3, "repeat": 2},
        "quantize": {"format": "QDQ", "per_channel": True},
        "evaluation": {"data": "package:photos", "offset": 12, "count": 2},
    }


@pytest.fixture(scope="session")
def gate_runs(tmp_path_factory) -> dict[str, Path]:
    """``baseline`` and ``same`` (identical settings: the same md5s), ``other`` (calibrated on other photos)."""
    root = tmp_path_factory.mktemp("gate-runs")
    runs = {}
    for label, offset in (("baseline", 0), ("same", 0), ("other", 3)):
        config = parse_pipeline(small_open_nsfw(offset), PIPELINES / "open_nsfw.toml")
        runs[label] = run_pipeline(config, root, run_id=f"open_nsfw-{label}").path
    return runs
