"""A 2-D ConvTranspose as a sub-pixel convolution: one Conv with stride² × C_out channels, each group of
channels one output phase, interleaved by DepthToSpace (CRD).

Why it is exact. A ConvTranspose adds ``x[i] · w[t]`` into the full output at ``s·i + d·t``. Output row
``y = s·q + r`` (phase ``r``) reads full row ``y + pad_begin``; only taps with ``d·t ≡ r + pad_begin (mod s)``
reach it, from inputs ``q + o`` for a few window offsets ``o``. So every phase is a plain correlation of
the input with its own subset of the (zero-padded) kernel taps; the phases share one window ``[lo, hi]``,
so one Conv computes them all, phase ``r`` in output channels ``m·s_h·s_w + r_h·s_w + r_w``, which is the
channel order DepthToSpace's CRD mode interleaves. Each output is the same sum of the same products as in
the ConvTranspose, only in another order (float rounding differs, nothing else); the Conv's extra taps are
zeros, which add exactly 0 for finite inputs.

Pads, output_padding, dilation, a kernel not a multiple of the stride and groups (depthwise included) only
change the taps and the window; where the interleaved rows do not line up with the output, a Slice cuts
the input's start or the output's end. Non-square strides interleave with Reshape → Transpose → Reshape
(DepthToSpace has one block size), which needs the spatial input size.

On the CUDA EP a Conv is a cuDNN forward convolution and DepthToSpace / Reshape / Transpose / Slice move
data: no step accumulates with atomics (measured bit-stable in EXHAUSTIVE, HEURISTIC and DEFAULT on an H100,
at the speed of the unstable original).

Why one Conv for all phases rather than one Conv per phase (each with only its own taps, then Concat and
DepthToSpace DCR): the shared window holds zeros (kernel 4 stride 2: a 3x3 window of which each phase uses
2x2, 2.25x the multiply-adds), but it is one cuDNN call instead of stride² calls and a Concat. Measured on
the CPU (onnxruntime 1.31.1, 1 thread, median of 10; ConvTranspose / one Conv / per-phase Convs): 64->32 on
56x56 k4s2p1 3.8 / 6.5 / 4.2 ms; 21->21 on 14x14 k8s4p2 0.34 / 0.45 / 0.52 ms; 21->21 on 7x7 k16s8p4
0.41 / 0.45 / 0.70 ms (64 Convs). Per-phase Convs win only at stride 2 on the CPU and lose as phases
multiply; on the GPU the one-Conv form matched the original's speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qconsist.errors import UnsupportedModelError
from qconsist.stages.rewrites.emit import INT64_MAX, Emitter

Taps = tuple[tuple[int | None, ...], ...]  # [phase][window position] -> kernel tap of the ConvTranspose (None: zero)


@dataclass(frozen=True)
class Geometry:
    """A ConvTranspose's attributes as ONNX resolves them (2-D)."""

    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]  # begin_h, begin_w, end_h, end_w
    output_padding: tuple[int, int]
    group: int

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        return tuple(  # type: ignore[return-value]
            s * (n - 1) + op + d * (k - 1) + 1 - pb - pe
            for n, s, op, d, k, pb, pe in zip(size, self.strides, self.output_padding, self.dilations, self.kernel,
                                             self.pads[:2], self.pads[2:])
        )

    def with_crop(self, begin: tuple[int, int], end: tuple[int, int]) -> "Geometry":
        """The same ConvTranspose followed by a spatial crop that removes ``begin`` / ``end`` rows and columns."""
        pads = (self.pads[0] + begin[0], self.pads[1] + begin[1], self.pads[2] + end[0], self.pads[3] + end[1])
        return Geometry(self.kernel, self.strides, self.dilations, pads, self.output_padding, self.group)


def overlaps(kernel: int, stride: int, dilation: int) -> bool:
    """Whether two taps of one input land on the same output (so outputs accumulate several products):
    some tap distance ``d·Δt`` (0 < Δt < k) is a multiple of the stride. Dilation 1: kernel > stride."""
    return any((dilation * step) % stride == 0 for step in range(1, kernel))


def overlapping_axes(geometry: Geometry) -> list[int]:
    return [axis for axis in range(2) if overlaps(geometry.kernel[axis], geometry.strides[axis], geometry.dilations[axis])]


def geometry_of(attributes: dict, weight_shape: tuple[int, ...]) -> Geometry:
    """Resolve the ONNX defaults; ``UnsupportedModelError`` for what this rewrite refuses (the message
    without the node's name, which the caller adds)."""
    if len(weight_shape) != 4:
        raise UnsupportedModelError(f"{len(weight_shape) - 2}-D ConvTranspose: only 2-D (a 4-D input) is rewritten")
    auto_pad = attributes.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedModelError(f"auto_pad {auto_pad}: write the pads explicitly (their split differs between "
                                    "the ONNX specification and runtimes)")
    if "output_shape" in attributes:
        raise UnsupportedModelError("output_shape is set: write pads and output_padding instead (runtimes derive the "
                                    "pads from output_shape differently)")
    kernel = tuple(attributes.get("kernel_shape", weight_shape[2:]))
    if kernel != tuple(weight_shape[2:]):
        raise UnsupportedModelError(f"kernel_shape {list(kernel)} differs from the weight's {list(weight_shape[2:])}")
    pads = tuple(attributes.get("pads", (0, 0, 0, 0))) if auto_pad != "VALID" else (0, 0, 0, 0)
    geometry = Geometry(
        kernel=kernel, strides=tuple(attributes.get("strides", (1, 1))), dilations=tuple(attributes.get("dilations", (1, 1))),
        pads=pads, output_padding=tuple(attributes.get("output_padding", (0, 0))), group=int(attributes.get("group", 1)),
    )
    if min(geometry.strides) < 1 or min(geometry.dilations) < 1 or min(geometry.pads) < 0 or min(geometry.output_padding) < 0:
        raise UnsupportedModelError(f"strides {list(geometry.strides)}, dilations {list(geometry.dilations)}, pads "
                                    f"{list(geometry.pads)}, output_padding {list(geometry.output_padding)}: must be positive "
                                    "(strides, dilations) and non-negative (pads, output_padding)")
    return geometry


@dataclass(frozen=True)
class AxisPlan:
    """One spatial axis of the sub-pixel form."""

    stride: int  # number of phases
    window: int  # the Conv's kernel size
    pad_begin: int
    pad_end: int
    input_start: int  # input rows the window never reaches (sliced off before the Conv)
    trim: int  # interleaved rows past the output (sliced off at the end)
    taps: Taps

    def conv_size(self, size: int) -> int:
        return size - self.input_start + self.pad_begin + self.pad_end - self.window + 1


def plan_axis(kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int, output_padding: int) -> AxisPlan:
    """Window, padding and per-phase taps of one axis. Output row ``s·q + r`` is full row
    ``s·(q + c_r) + ρ_r`` (``c_r, ρ_r = divmod(r + pad_begin, s)``): the sum over ``m`` of
    ``x[q + c_r − m] · w_e[ρ_r + s·m]``, ``w_e`` the kernel dilated and padded with zeros to ``s·T`` taps."""
    extent = dilation * (kernel - 1) + 1
    span = -(-extent // stride)  # T: taps of one phase
    carry = [(r + pad_begin) // stride for r in range(stride)]
    phase = [(r + pad_begin) % stride for r in range(stride)]
    lo, hi = min(carry) - (span - 1), max(carry)
    growth = output_padding + extent - stride - pad_begin - pad_end  # output = stride · input + growth
    needed_end = -(-growth // stride) + hi  # the Conv must give input + ceil(growth / s) rows
    pad_end_conv = max(0, needed_end)
    taps = []
    for r in range(stride):
        row = []
        for position in range(hi - lo + 1):
            m = carry[r] - (position + lo)
            tap = phase[r] + stride * m
            row.append(tap // dilation if 0 <= m < span and tap < extent and tap % dilation == 0 else None)
        taps.append(tuple(row))
    return AxisPlan(
        stride=stride, window=hi - lo + 1, pad_begin=max(0, -lo), pad_end=pad_end_conv, input_start=max(0, lo),
        trim=stride * (pad_end_conv - hi) - growth, taps=tuple(taps),
    )


def subpixel_weights(weight: np.ndarray, bias: np.ndarray | None, group: int, plans: tuple[AxisPlan, AxisPlan]
                     ) -> tuple[np.ndarray, np.ndarray | None]:
    """The Conv's weight (M·s_h·s_w, C/group, window_h, window_w) and bias from the ConvTranspose's
    weight (C, M/group, k_h, k_w) and bias (M)."""
    channels, per_group = weight.shape[:2]
    outputs, inputs = per_group * group, channels // group
    grouped = weight.reshape(group, inputs, per_group, *weight.shape[2:]).transpose(0, 2, 1, 3, 4)
    grouped = grouped.reshape(outputs, inputs, *weight.shape[2:])  # (M, C/group, k_h, k_w)
    ph, pw = plans
    conv = np.zeros((outputs, ph.stride, pw.stride, inputs, ph.window, pw.window), dtype=weight.dtype)
    for rh, row_h in enumerate(ph.taps):
        for jh, th in enumerate(row_h):
            if th is None:
                continue
            for rw, row_w in enumerate(pw.taps):
                for jw, tw in enumerate(row_w):
                    if tw is not None:
                        conv[:, rh, rw, :, jh, jw] = grouped[:, :, th, tw]
    conv = conv.reshape(outputs * ph.stride * pw.stride, inputs, ph.window, pw.window)
    return conv, None if bias is None else np.repeat(bias, ph.stride * pw.stride)


def emit_subpixel(out: Emitter, source: str, output: str, geometry: Geometry, weight: np.ndarray, bias: np.ndarray | None,
                  spatial: tuple[int | None, int | None]) -> dict:
    """Append the sub-pixel nodes reading ``source`` and writing ``output``; returns the plan's summary.
    ``spatial``: the input's height and width where known (needed only for non-square strides)."""
    plans = tuple(plan_axis(geometry.kernel[a], geometry.strides[a], geometry.dilations[a], geometry.pads[a],
                            geometry.pads[a + 2], geometry.output_padding[a]) for a in range(2))
    ph, pw = plans
    if ph.stride != pw.stride and ph.stride > 1 and pw.stride > 1 and None in spatial:
        raise UnsupportedModelError(f"strides {list(geometry.strides)} differ per axis and the input's spatial size is "
                                    "not known (interleaving them needs it; give the model static shapes)")
    conv_weight, conv_bias = subpixel_weights(weight, bias, geometry.group, plans)  # type: ignore[arg-type]
    x = source
    cut = [(axis + 2, plan.input_start) for axis, plan in enumerate(plans) if plan.input_start]
    if cut:
        x = out.slice(x, [a for a, _ in cut], [s for _, s in cut], [INT64_MAX] * len(cut), "skip_rows")
    inputs = [x, out.constant("W", conv_weight)] + ([out.constant("B", conv_bias)] if conv_bias is not None else [])
    y = out.node("Conv", inputs, "subpixel_conv", kernel_shape=[ph.window, pw.window], strides=[1, 1], dilations=[1, 1],
                 pads=[ph.pad_begin, pw.pad_begin, ph.pad_end, pw.pad_end], group=geometry.group)
    channels = conv_weight.shape[0] // (ph.stride * pw.stride)
    if ph.stride == pw.stride > 1:
        y = out.node("DepthToSpace", [y], "depth_to_space", blocksize=ph.stride, mode="CRD")
    elif ph.stride * pw.stride > 1:
        rows, cols = (plan.conv_size(size) for plan, size in zip(plans, spatial))  # type: ignore[arg-type]
        y = out.node("Reshape", [y, out.constant("phases_shape", np.array([0, channels, ph.stride, pw.stride, rows, cols], np.int64))],
                     "phases")
        y = out.node("Transpose", [y], "interleave", perm=[0, 1, 4, 2, 5, 3])
        y = out.node("Reshape", [y, out.constant("output_shape", np.array([0, channels, rows * ph.stride, cols * pw.stride], np.int64))],
                     "merge")
    trims = [(axis + 2, plan.trim) for axis, plan in enumerate(plans) if plan.trim]
    if trims:
        y = out.slice(y, [a for a, _ in trims], [0] * len(trims), [-t for _, t in trims], "trim")
    out.rename_last_output(output)
    return {
        "conv_kernel": [ph.window, pw.window], "conv_channels": int(conv_weight.shape[0]),
        "conv_pads": [ph.pad_begin, pw.pad_begin, ph.pad_end, pw.pad_end],
        "input_start": [ph.input_start, pw.input_start], "trim": [ph.trim, pw.trim],
    }
