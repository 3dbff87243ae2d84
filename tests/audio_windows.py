"""Audio for the voice-activity model of the corpus (models/silero_vad.toml), made here and seeded: 2 s at 16 kHz
of a voiced sound (a 140 Hz glottal-like harmonic series with 3 Hz vibrato, eleven harmonics falling as 1/k)
switched on and off at 2 Hz after half a second of faint noise, cut into the model's 512-sample windows.

The model is stateful: each window is fed with the LSTM state the previous window left (``stateN``), zeros
before the first. ``vad_windows`` runs that chain once with plain onnxruntime at level disable and writes each
window with its state and the sample rate as one ``.npz`` (a folder of them is an input set fed exactly as it
is), so that runs at any level are fed the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

RATE = 16000
WINDOW = 512


def voiced_audio(seconds: float = 2.0, seed: int = 27) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds)) / RATE
    f0 = 140 + 10 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.cumsum(np.pi * f0 / RATE)
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 2 * t), 0, None) ** 0.5 * (t > 0.5)
    return (0.1 * envelope * voiced + 0.002 * rng.standard_normal(t.size)).astype(np.float32)


def vad_session(model: Path, level: str = "disable") -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def vad_windows(model: Path, folder: Path, first: int, count: int) -> list[dict[str, np.ndarray]]:
    """Windows ``first`` .. ``first + count - 1`` of ``voiced_audio`` with the states the chain gives them
    (level disable), written to ``folder/NNN.npz``; returns their feeds."""
    audio, session = voiced_audio(), vad_session(model)
    state, feeds = np.zeros((2, 1, 128), np.float32), []
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(first + count):
        feed = {"input": audio[index * WINDOW:(index + 1) * WINDOW][None], "state": state, "sr": np.array(RATE, np.int64)}
        if index >= first:
            np.savez(folder / f"{index:03d}.npz", **feed)
            feeds.append(feed)
        state = session.run(["stateN"], feed)[0]
    return feeds
