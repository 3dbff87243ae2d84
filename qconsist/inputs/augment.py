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
    bases = PhotoBases(paths, preprocess)
    return np.stack([bases[i] for i in range(len(bases))])


class PhotoBases:
    """The photos preprocessed without the crop, each made when first asked for, in the process that asks (an
    input worker makes the ones it needs)."""

    def __init__(self, paths: list[Path], preprocess) -> None:  # preprocess: Preprocess
        if preprocess is None or preprocess.crop is None:
            raise InputError(f"{PREFIX}...: augmented photos are cropped: the pipeline's [preprocess] must declare `crop`")
        self.paths, self.uncropped, self.made = list(paths), replace(preprocess, crop=None), {}

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> np.ndarray:
        if index not in self.made:
            self.made[index] = self.uncropped.apply(self.paths[index])[0]
        return self.made[index]


class AugmentedPhotos:
    """Sample ``index`` of the augmented set as a ``(1, …)`` array, from the base photos (an array of them, or
    ``PhotoBases``) and the seed."""

    def __init__(self, bases, crop: tuple[int, int], seed: int, channels_first: bool = True) -> None:
        self.bases, self.crop, self.seed, self.channels_first = bases, tuple(crop), seed, channels_first
        self._room(0)  # a crop larger than the photos: said at once

    def _room(self, photo: int) -> tuple[int, int]:
        base = self.bases[photo]
        height, width = base.shape[1:3] if self.channels_first else base.shape[0:2]
        if self.crop[0] > height or self.crop[1] > width:
            raise InputError(f"{PREFIX}...: the photos are {height}x{width} before the crop, smaller than {self.crop[0]}x{self.crop[1]}")
        return height - self.crop[0], width - self.crop[1]

    def __call__(self, index: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, index))
        photo = index % len(self.bases)
        top, left = (int(rng.integers(0, r + 1)) for r in self._room(photo))
        flip = bool(rng.integers(0, 2))
        base = self.bases[photo]
        ch, cw = self.crop
        if self.channels_first:
            out = base[:, top:top + ch, left:left + cw]
            out = out[:, :, ::-1] if flip else out
        else:
            out = base[top:top + ch, left:left + cw]
            out = out[:, ::-1] if flip else out
        return np.ascontiguousarray(out[None], dtype=np.float32)
