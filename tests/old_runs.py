"""The real runs written in the per-sample layout that tests/data/old_runs keeps (made by its make_old_runs.py
with qconsist at 1570a31 — class folders, labels, xxh3 digests — and at 6fe134f — a flat folder, sha256
digests), and the same inputs and models made again here, to write runs of today's layout beside them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from onnx_builders import build_classifier_model

OLD_RUNS = Path(__file__).resolve().parent / "data" / "old_runs"
VARIANT_BIAS = [0.3, 0.0, 0.0, 0.0, 0.0]  # the ``-b`` runs' model: the classifier with another fc bias


def copy_old(name: str, runs: Path) -> Path:
    """A private copy of an old run in ``runs``."""
    runs.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(OLD_RUNS / name, runs / name, symlinks=True))


def old_inputs(work: Path, flat: bool = False) -> dict[str, Path]:
    """The images (8 seeded 12x12 PNGs; in 5 class folders unless ``flat``), the pipeline that prepares them and
    the two models, as make_old_runs.py made them."""
    work.mkdir(parents=True, exist_ok=True)
    model = build_classifier_model(work / "classifier.onnx")
    variant = build_classifier_model(work / "variant.onnx", fc_bias=VARIANT_BIAS)
    images = work / "images"
    rng = np.random.default_rng(5)
    for i in range(8):
        folder = images if flat else images / f"class{i % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    pipeline = work / "tiny.toml"
    pipeline.write_text(f'name = "tiny"\n[model]\nonnx = "{model}"\n[calibration]\ndata = "{images}"\n'
                        '[preprocess]\nresize = [8, 8]\npixel_range = 1.0\n')
    return {"model": model, "variant": variant, "images": images, "pipeline": pipeline}
