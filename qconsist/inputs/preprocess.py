"""Image preprocessing declared in a pipeline file, Caffe conventions included.

Order of operations (as Caffe's ``caffe.io.Transformer`` with ``raw_scale``): decode → RGB → resize →
centre crop → float in [0, ``pixel_range``] → channel order → subtract ``mean`` → multiply by ``scale``
(or divide by ``std``) → layout → batch dimension of 1.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.errors import ConfigError, InputError
from qconsist.store.serde import serialized


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


@serialized
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
                    if value is not None and not isinstance(value, (list, tuple)):  # resize = 256
                        square = f" (a square: {key} = [{value}, {value}])" if isinstance(value, int) and not isinstance(value, bool) else ""
                        raise ConfigError(f"{where}.{key} must be [height, width] of positive integers, got {value!r}{square}")
                    if value is not None and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                        raise ConfigError(f"{where}.{key} must be [height, width] of positive integers, got {value!r}")
                    kwargs[key] = tuple(value) if value is not None else None
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

    def apply(self, path: Path) -> np.ndarray:
        """Decode ``path`` (under ``MAX_IMAGE_PIXELS``, its mode converted by ``mode_rule``) and return a float32
        array with a batch dimension of 1."""
        return self.prepare(path)[0]

    def prepare(self, path: Path) -> tuple[np.ndarray, str]:
        """``apply``'s array and the PIL mode the image had (``mode_rule`` says how it was converted)."""
        from PIL import Image

        resample = {
            Interpolation.BILINEAR: Image.Resampling.BILINEAR,
            Interpolation.NEAREST: Image.Resampling.NEAREST,
            Interpolation.BICUBIC: Image.Resampling.BICUBIC,
        }[self.interpolation]
        size = None if self.resize is None else (self.resize[1], self.resize[0])
        array, mode = decode_image(path, size, resample)  # H, W, 3 in [0, 255]
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
        return np.ascontiguousarray(array[None], dtype=np.float32), mode


# The largest image qconsist decodes (width x height): 50 megapixels, e.g. 8660 x 5773. A photograph for a
# classifier is far smaller; a bigger one (or a decompression bomb) is refused in one line before it is decoded.
MAX_IMAGE_PIXELS = 50_000_000

_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def mode_rule(mode: str) -> str | None:
    """How an image of PIL ``mode`` becomes 8-bit-range RGB (None: it already is). The one rule, documented in
    docs/trust.md ("Images"): 16-bit samples are scaled by 255/65535 (never clipped), grayscale is replicated to three
    channels, an alpha channel is dropped (not composited), a palette is expanded, CMYK and other colour spaces
    are converted by Pillow; 32-bit float images are refused."""
    if mode == "RGB":
        return None
    if mode in _SIXTEEN_BIT:
        return f"{mode}: 16-bit grayscale scaled by 255/65535, replicated to 3 channels"
    return {
        "L": "L: grayscale replicated to 3 channels",
        "1": "1: bilevel as 0/255, replicated to 3 channels",
        "LA": "LA: alpha dropped, grayscale replicated to 3 channels",
        "P": "P: palette expanded to RGB",
        "PA": "PA: palette expanded to RGB, alpha dropped",
        "RGBA": "RGBA: alpha dropped",
        "RGBX": "RGBX: padding channel dropped",
        "RGBa": "RGBa: alpha dropped",
        "CMYK": "CMYK: converted to RGB by Pillow",
        "YCbCr": "YCbCr: converted to RGB by Pillow",
        "LAB": "LAB: converted to RGB by Pillow",
        "HSV": "HSV: converted to RGB by Pillow",
    }.get(mode, f"{mode}: converted to RGB by Pillow")


def _open(path: Path):
    """``PIL.Image.open`` (lazy: the header only) with the pixel limit applied; PIL's own bomb warning is not
    printed (the limit is below it) and its bomb error becomes the same one-line refusal."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
    except FileNotFoundError:
        raise InputError(f"image {path} does not exist") from None
    except Image.DecompressionBombError as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = found.group(1) if found else "too many"
        raise InputError(f"image {path} has {pixels} pixels, above the limit of {MAX_IMAGE_PIXELS} (50 megapixels)") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InputError(f"cannot read image {path}: {exc}") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        image.close()
        raise InputError(f"image {path} has {width * height} pixels ({width}x{height}), above the limit of "
                         f"{MAX_IMAGE_PIXELS} (50 megapixels)")
    if image.mode == "F":
        image.close()
        raise InputError(f"image {path} holds 32-bit float pixels (mode F); save such data as .npy instead")
    try:
        animated = bool(getattr(image, "is_animated", False))  # a second frame exists (GIF, APNG, WebP, multi-page TIFF)
    except (OSError, EOFError, SyntaxError, ValueError) as exc:
        image.close()
        raise InputError(f"cannot read image {path}: {exc}") from None
    if animated:
        frames = getattr(image, "n_frames", "several")
        image.close()
        raise InputError(f"image {path} holds {frames} frames ({image.format} animation or pages); a sample is one "
                         "picture: save the frame you mean as its own file")
    image.seek(0)
    return image


# The most a resize may enlarge an image, per side: a 28x28 digit or a 32x32 thumbnail brought to 224x224 (7-8x)
# is still a picture; a 1x1 or 8x8 file resized 28-224 times is a placeholder or a broken file, refused.
MAX_ENLARGEMENT = 8


def _check_enlargement(path: Path, found: tuple[int, int], size: tuple[int, int]) -> None:
    """Refuse a resize from ``found`` to ``size`` (both width, height) that enlarges a side more than
    ``MAX_ENLARGEMENT`` times."""
    (width, height), (to_width, to_height) = found, size
    factor = max(to_width / max(width, 1), to_height / max(height, 1))
    if factor > MAX_ENLARGEMENT:
        raise InputError(f"image {path} is {width}x{height}: resizing it to {to_width}x{to_height} would enlarge it "
                         f"{factor:.3g} times, more than {MAX_ENLARGEMENT}; remove it, or enlarge it yourself if it "
                         "is meant")


def image_mode(path: Path) -> str:
    """The PIL mode of ``path`` (its header only), as ``read_image`` will see it."""
    with _open(path) as image:
        return image.mode


def read_image(path: Path, size: tuple[int, int] | None = None, resample: int = 2) -> np.ndarray:
    """``path`` as float32 (H, W, 3) in [0, 255] under ``mode_rule``, resized to ``size`` (width, height)."""
    return decode_image(path, size, resample)[0]


def decode_image(path: Path, size: tuple[int, int] | None = None, resample: int = 2) -> tuple[np.ndarray, str]:
    """``read_image``'s array and the image's PIL mode before conversion."""
    from PIL import Image

    try:
        with _open(path) as image:
            mode = image.mode  # as its header says (``image_mode``), before decoding
            if size is not None:
                _check_enlargement(path, image.size, size)
            image.load()
            if image.mode in _SIXTEEN_BIT:
                gray = image.convert("F")
                values = np.asarray(gray, dtype=np.float32)
                if values.size and (values.min() < 0 or values.max() > 65535):
                    raise InputError(f"image {path} (mode {image.mode}) has values outside 0..65535")
                if size is not None:
                    gray = Image.fromarray(values, "F").resize(size, resample=resample)
                    values = np.asarray(gray, dtype=np.float32)
                values = values * np.float32(255.0 / 65535.0)
                return np.repeat(values[..., None], 3, axis=2), mode
            rgb = image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputError(f"cannot read image {path}: {exc}") from None
    if size is not None:
        rgb = rgb.resize(size, resample=resample)
    return np.asarray(rgb, dtype=np.float32), mode
