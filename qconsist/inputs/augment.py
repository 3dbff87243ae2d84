"""Many samples from the bundled photographs: seeded random crops and horizontal flips (no download).

``package:photos:augmented:COUNT[:SEED]`` names such a set: sample ``i`` is photo ``i mod P`` (the bundled
photos preprocessed once, without the centre crop), cropped at a position and flipped or not as the
random generator seeded with ``(SEED, i)`` says. Every sample is made when it is read, from nothing but
its index, so an evaluation of 50,000 samples holds the P base photos and one step in memory.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from qconsist.errors import ConfigError, InputError

PREFIX = "package:photos:augmented:"


def parse_source(text: str) -> tuple[int, int]:
    """(count, seed) of ``package:photos:augmented:COUNT[:SEED]``."""
    parts = text[len(PREFIX):].split(":")
    try:
        count, seed = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        count = seed = -1
    if len(parts) > 2 or count < 1 or seed < 0:
        raise ConfigError(f"input set {text!r}: write {PREFIX}COUNT[:SEED] with COUNT >= 1 and SEED >= 0")
    return count, seed


def base_photos(paths: list[Path], preprocess) -> np.ndarray:  # preprocess: Preprocess
    """The photos preprocessed without the crop, stacked: (P, C, H, W) or (P, H, W, C) float32."""
    if preprocess is None or preprocess.crop is None:
        raise InputError(f"{PREFIX}...: augmented photos are cropped: the pipeline's [preprocess] must declare `crop`")
    uncropped = replace(preprocess, crop=None)
    return np.concatenate([uncropped.apply(p) for p in paths])


class AugmentedPhotos:
    """Sample ``index`` of the augmented set as a ``(1, …)`` array, from the base photos and the seed."""

    def __init__(self, bases: np.ndarray, crop: tuple[int, int], seed: int, channels_first: bool = True) -> None:
        self.bases, self.crop, self.seed, self.channels_first = bases, tuple(crop), seed, channels_first
        height, width = bases.shape[2:4] if channels_first else bases.shape[1:3]
        if crop[0] > height or crop[1] > width:
            raise InputError(f"{PREFIX}...: the photos are {height}x{width} before the crop, smaller than {crop[0]}x{crop[1]}")
        self.room = (height - crop[0], width - crop[1])

    def __call__(self, index: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, index))
        top, left = (int(rng.integers(0, r + 1)) for r in self.room)
        flip = bool(rng.integers(0, 2))
        base = self.bases[index % len(self.bases)]
        ch, cw = self.crop
        if self.channels_first:
            out = base[:, top:top + ch, left:left + cw]
            out = out[:, :, ::-1] if flip else out
        else:
            out = base[top:top + ch, left:left + cw]
            out = out[:, ::-1] if flip else out
        return np.ascontiguousarray(out[None], dtype=np.float32)
