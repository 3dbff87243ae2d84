"""Which GPU an entry ran on: the devices this process sees, as it sees them and as the host numbers them.

A scheduler (Ray) gives a task its GPUs by setting ``CUDA_VISIBLE_DEVICES`` in the worker: the process then
numbers its GPUs 0, 1, … (the CUDA device id an onnxruntime session takes as ``device_id``), in the order of
that variable, while ``nvidia-smi`` numbers every GPU of the host whatever the variable says. ``visible_gpus``
joins the two: for each GPU this process sees, its index here, its index on the host, its UUID (the one name
that does not change when the numbering does) and its name. The environment fingerprint records the variable
and every GPU of the host (``gpus``), not which of them the process used: this is that record.

``CUDA_VISIBLE_DEVICES`` takes host indices (``0,1``) or UUIDs and UUID prefixes (``GPU-8d3c…``); CUDA stops at
the first entry it cannot resolve, and so does this. Host indices are read in ``nvidia-smi``'s (PCI bus)
order, which is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and, on a node of identical GPUs, CUDA's default
as well.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Sequence

from qconsist.store.serde import serialized

QUERY = "index,uuid,name,pci.bus_id"
SMI_SECONDS = 20


@serialized
@dataclass(frozen=True)
class GpuDevice:
    """One GPU as an entry used it: ``index`` as this process numbers it (CUDA's device id), ``host_index`` as
    the host does (``nvidia-smi``), its ``uuid`` and ``name``, and its PCI bus id."""

    index: int
    host_index: int
    uuid: str
    name: str
    bus_id: str = ""

    @property
    def short(self) -> str:
        """``GPU 1 (GPU-8d3c0f2a)``: the host's number and the start of the UUID."""
        return f"GPU {self.host_index} ({self.uuid[:12]})"

    def __str__(self) -> str:
        seen = f", device {self.index} in its process" if self.index != self.host_index else ""
        return f"GPU {self.host_index} of the host ({self.name}, {self.uuid}{seen})"


def host_gpus(smi_output: str) -> list[GpuDevice]:
    """The host's GPUs from ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id --format=csv,noheader``,
    numbered as the host numbers them (``index`` = ``host_index``)."""
    gpus = []
    for line in smi_output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            gpus.append(GpuDevice(index=int(parts[0]), host_index=int(parts[0]), uuid=parts[1], name=parts[2],
                                  bus_id=parts[3] if len(parts) > 3 else ""))
    return gpus


def _resolve(token: str, host: Sequence[GpuDevice]) -> GpuDevice | None:
    token = token.strip()
    if token.isdigit():
        return next((g for g in host if g.host_index == int(token)), None)
    if token.upper().startswith("GPU-"):
        found = [g for g in host if g.uuid.lower().startswith(token.lower())]
        return found[0] if len(found) == 1 else None
    return None  # MIG-… and anything else: not a whole GPU this module can name


def visible_from(visible: str | None, host: Sequence[GpuDevice]) -> list[GpuDevice]:
    """The GPUs a process with ``CUDA_VISIBLE_DEVICES=visible`` sees, numbered as it numbers them."""
    if visible is None:
        return list(host)
    seen: list[GpuDevice] = []
    for token in visible.split(","):
        gpu = _resolve(token, host)
        if gpu is None or any(g.uuid == gpu.uuid for g in seen):
            break  # CUDA ignores the rest of the list from the first entry it cannot use
        seen.append(GpuDevice(index=len(seen), host_index=gpu.host_index, uuid=gpu.uuid, name=gpu.name, bus_id=gpu.bus_id))
    return seen


def query_host_gpus() -> list[GpuDevice]:
    """The host's GPUs, from ``nvidia-smi`` (none where it is missing or fails)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, f"--query-gpu={QUERY}", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=SMI_SECONDS, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return host_gpus(out)


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[GpuDevice]:
    """The GPUs this process sees (``CUDA_VISIBLE_DEVICES`` over ``nvidia-smi``), in its own numbering."""
    environ = os.environ if environ is None else environ
    return visible_from(environ.get("CUDA_VISIBLE_DEVICES"), query_host_gpus())
