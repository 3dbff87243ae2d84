"""Nightly files for tests, derived from the bundled pipelines/nightly.toml: the same models, pipelines and
policies, with small input counts (and paths made absolute) so that a night takes seconds per model."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "pipelines" / "nightly.toml"
SMALL = {"calibration": {"count": 3, "repeat": 2}, "evaluation": {"offset": 12, "count": 2}}


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _table(prefix: str, data: dict) -> list[str]:
    lines = [f"[{prefix}]"] + [f"{k} = {_toml(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, value in data.items():
        if isinstance(value, dict):
            lines += _table(f"{prefix}.{key}", value)
    return lines


def derived_nightly(folder: Path, models: Iterable[str] | None = None, extra: dict[str, dict] | None = None) -> Path:
    """``folder/nightly.toml``: the bundled nightly's entries (those named in ``models``, in its order), small
    counts, ``runs_dir = "runs"``; ``extra`` adds keys to an entry (``{"fcn_head": {"gpus": ["H100"]}}``)."""
    bundled = tomllib.loads(BUNDLED.read_text())
    base = BUNDLED.parent
    wanted = set(models) if models is not None else None
    lines = ['runs_dir = "runs"', f"policy = {_toml(str((base / bundled['policy']).resolve()))}"]
    for entry in bundled["models"]:
        if wanted is not None and entry["name"] not in wanted:
            continue
        entry = dict(entry)
        for key in ("pipeline", "policy"):
            if isinstance(entry.get(key), str):
                entry[key] = str((base / entry[key]).resolve())
        entry.update((extra or {}).get(entry["name"], {}))
        if isinstance(entry.get("pipeline"), dict):
            for section, values in SMALL.items():
                entry["pipeline"][section] = {**entry["pipeline"].get(section, {}), **values}
        else:
            entry["set"] = {section: {**entry.get("set", {}).get(section, {}), **values} for section, values in SMALL.items()} | {
                k: v for k, v in entry.get("set", {}).items() if k not in SMALL}
        tables = {k: v for k, v in entry.items() if isinstance(v, dict)}
        lines.append("[[models]]")
        lines += [f"{k} = {_toml(v)}" for k, v in entry.items() if not isinstance(v, dict)]
        for key, value in tables.items():
            lines += _table(f"models.{key}", value)
    path = Path(folder) / "nightly.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def convnet_nightly(folder: Path, percentile: bool = False) -> Path:
    """``folder/nightly.toml`` over the small conv net built in code (``onnx_builders.small_convnet``): model
    ``convnet`` (MinMax calibration on 4 samples, repeated twice; 3 evaluation samples); with ``percentile``
    also ``convnet-percentile`` (Percentile 99.9), both with labels for the evaluation samples. Changing a
    sample of ``calibration.npy`` changes the quantized model."""
    import numpy as np

    from onnx_builders import small_convnet

    small_convnet(folder / "convnet.onnx")
    rng = np.random.default_rng(11)
    np.save(folder / "calibration.npy", rng.normal(0, 1, (4, 3, 16, 16)).astype(np.float32))
    np.save(folder / "evaluation.npy", rng.normal(0, 1, (3, 3, 16, 16)).astype(np.float32))
    (folder / "policy.toml").write_text("[drift.float]\nmax_abs_diff = 0.2\nmin_top1_agreement = 0.6\n")
    model = ('[models.pipeline.model]\nonnx = "convnet.onnx"\n'
             '[models.pipeline.calibration]\ndata = "calibration.npy"\nrepeat = 2\n{method}'
             '[models.pipeline.quantize]\nper_channel = true\n'
             '[models.pipeline.evaluation]\ndata = "evaluation.npy"\n')
    text = 'runs_dir = "runs"\npolicy = "policy.toml"\n[[models]]\nname = "convnet"\n'
    if percentile:
        (folder / "labels.json").write_text('{"000000": 0, "000001": 1, "000002": 3}')
        text += 'labels = "labels.json"\n'
    text += model.format(method="")
    if percentile:
        text += ('[[models]]\nname = "convnet-percentile"\nlabels = "labels.json"\n'
                 + model.format(method='method = "Percentile"\npercentile = 99.9\n'))
    config = folder / "nightly.toml"
    config.write_text(text)
    return config


def convnet_entries(folder: Path, names: Iterable[str], cpus: int = 1) -> Path:
    """``folder/nightly.toml``: one entry per name in ``names`` (in that order), each the small conv net of
    ``convnet_nightly`` with ``cpus`` (1: two run at once on a Ray of 2 CPUs)."""
    path = convnet_nightly(folder)
    head, _, entry = path.read_text().partition("[[models]]\n")
    entry = entry.replace('name = "convnet"\n', 'name = "{name}"\n' + f"cpus = {cpus}\n")
    path.write_text(head + "".join("[[models]]\n" + entry.replace("{name}", name) for name in names))
    return path
