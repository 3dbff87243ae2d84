"""Image preprocessing declared in a pipeline file, Caffe conventions included.

Order of operations (as Caffe's ``caffe.io.Transformer`` with ``raw_scale``): decode → RGB → resize →
centre crop → float in [0, ``pixel_range``] → channel order → subtract ``mean`` → multiply by ``scale``
(or divide by ``std``) → layout → batch dimension of 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.errors import ConfigError, InputError


class ChannelOrder(str, Enum):
    RGB = "RGB"
    BGR = "BGR"


class Layout(str, Enum):
    NCHW = "NCHW"
    NHWC = "NHWC"


class Interpolation(str, Enum):
    BILINEAR = "bilinear"
    NEAREST = "nearest"
    BICUBIC = "bicubic"


@dataclass(frozen=True)
class Preprocess:
    resize: tuple[int, int] | None = None  # (height, width); the whole image is resized (Caffe warps)
    crop: tuple[int, int] | None = None  # (height, width), centre crop after resize
    interpolation: Interpolation = Interpolation.BILINEAR
    channel_order: ChannelOrder = ChannelOrder.RGB
    pixel_range: float = 255.0  # pixel values span [0, pixel_range] before mean/scale
    mean: tuple[float, ...] = ()  # per channel, in ``channel_order``; empty = none
    std: tuple[float, ...] = ()  # per channel divisor; empty = none
    scale: float = 1.0  # multiplier after mean subtraction (Caffe's input scale)
    layout: Layout = Layout.NCHW

    def __post_init__(self) -> None:
        for name in ("resize", "crop"):
            value = getattr(self, name)
            if value is not None and (len(value) != 2 or any(int(v) <= 0 for v in value)):
                raise ConfigError(f"preprocess.{name} must be [height, width] of positive integers, got {list(value)}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value and len(value) not in (1, 3):
                raise ConfigError(f"preprocess.{name} must have 1 or 3 values, got {len(value)}")
        if any(v == 0 for v in self.std):
            raise ConfigError("preprocess.std must not contain 0")
        if self.pixel_range <= 0:
            raise ConfigError("preprocess.pixel_range must be positive")

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "preprocess") -> "Preprocess":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        kwargs: dict[str, Any] = {}
        try:
            for key, value in data.items():
                if key in ("resize", "crop"):
                    kwargs[key] = tuple(int(v) for v in value) if value is not None else None
                elif key in ("mean", "std"):
                    kwargs[key] = tuple(float(v) for v in value)
                elif key == "interpolation":
                    kwargs[key] = Interpolation(value)
                elif key == "channel_order":
                    kwargs[key] = ChannelOrder(str(value).upper())
                elif key == "layout":
                    kwargs[key] = Layout(str(value).upper())
                else:
                    kwargs[key] = float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.{key}: invalid value {value!r} ({exc})") from None
        return cls(**kwargs)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("interpolation", "channel_order", "layout"):
            data[key] = getattr(self, key).value
        for key in ("resize", "crop", "mean", "std"):
            data[key] = list(data[key]) if data[key] is not None else None
        return data

    def apply(self, path: Path) -> np.ndarray:
        """Decode ``path`` and return a float32 array with a batch dimension of 1."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as image:
                image.load()
                rgb = image.convert("RGB")
        except FileNotFoundError:
            raise InputError(f"image {path} does not exist") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise InputError(f"cannot read image {path}: {exc}") from None
        if self.resize is not None:
            height, width = self.resize
            resample = {
                Interpolation.BILINEAR: Image.Resampling.BILINEAR,
                Interpolation.NEAREST: Image.Resampling.NEAREST,
                Interpolation.BICUBIC: Image.Resampling.BICUBIC,
            }[self.interpolation]
            rgb = rgb.resize((width, height), resample=resample)
        array = np.asarray(rgb, dtype=np.float32)  # H, W, 3 in [0, 255]
        if self.crop is not None:
            ch, cw = self.crop
            h, w = array.shape[:2]
            if ch > h or cw > w:
                raise InputError(f"image {path} is {h}x{w} after resize, smaller than the crop {ch}x{cw}")
            top, left = (h - ch) // 2, (w - cw) // 2
            array = array[top : top + ch, left : left + cw]
        if self.pixel_range != 255.0:
            array = array * np.float32(self.pixel_range / 255.0)
        if self.channel_order is ChannelOrder.BGR:
            array = array[..., ::-1]
        if self.mean:
            array = array - np.asarray(self.mean, dtype=np.float32)
        if self.std:
            array = array / np.asarray(self.std, dtype=np.float32)
        if self.scale != 1.0:
            array = array * np.float32(self.scale)
        if self.layout is Layout.NCHW:
            array = array.transpose(2, 0, 1)
        return np.ascontiguousarray(array[None], dtype=np.float32)
