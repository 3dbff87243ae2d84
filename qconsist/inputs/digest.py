"""The identity of an input set: a digest per sample and one over the set, and the kinds they come in.

**xxh3-128** (written since qconsist 0.2): each sample's digest is xxh3-128 over, for each input name in sorted
order, ``name|dtype|shape|`` and the tensor's exact bytes (C order) — the tensor the model is fed, after
decoding, preprocessing and any cast, so a change of decoder or preprocessing changes it; the set's digest is
``xxh3-128:`` and the xxh3-128 of the samples' 16-byte digests in order. Both are computed where the samples
are prepared (the input workers, ``qconsist.inputs.stream``) and depend on nothing but the samples and their
order: not on the batch size, the number of workers or the machine.

**sha256** (runs written before): one sha256 over the same ``name|dtype|shape|`` headers and bytes of every
sample in order, written as 64 hex digits without a prefix. ``digest_kind`` tells the two apart; digests of
different kinds are never compared as if they were one (``same_inputs`` answers ``None``: unknown).

Files are digested too (``file_digest``: xxh3-128 of an image's or array file's bytes), for the record of
which files a run read; the set's identity is the tensors'.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import xxhash

XXH3 = "xxh3-128"
SHA256 = "sha256"
PREFIX = XXH3 + ":"


def _headers(sample: Mapping[str, np.ndarray]):
    for name in sorted(sample):
        array = np.ascontiguousarray(sample[name])
        yield f"{name}|{array.dtype.str}|{array.shape}|".encode(), array


def sample_digest(sample: Mapping[str, np.ndarray]) -> bytes:
    """The 16-byte xxh3-128 digest of one sample (batch dimension 1), as the module docstring defines it."""
    h = xxhash.xxh3_128()
    for header, array in _headers(sample):
        h.update(header)
        h.update(array)  # the buffer itself, C order
    return h.digest()


def set_digest(digests: Iterable[bytes]) -> str:
    """``xxh3-128:<hex>`` over the samples' digests in order."""
    h = xxhash.xxh3_128()
    for digest in digests:
        h.update(digest)
    return PREFIX + h.hexdigest()


def legacy_digest(samples: Iterable[Mapping[str, np.ndarray]]) -> str:
    """The sha256 digest runs recorded before xxh3-128 (to check an old run's inputs against it)."""
    h = hashlib.sha256()
    for sample in samples:
        for header, array in _headers(sample):
            h.update(header)
            h.update(array.tobytes())
    return h.hexdigest()


def file_digest(path: Path, block: int = 1 << 20) -> bytes:
    """xxh3-128 of a file's bytes."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            h.update(chunk)
    return h.digest()


def digest_kind(digest: object) -> str | None:
    """``xxh3-128``, ``sha256`` (an old run's) or ``None`` for anything else (absent, damaged)."""
    if not isinstance(digest, str):
        return None
    if digest.startswith(PREFIX) and len(digest) == len(PREFIX) + 32:
        return XXH3
    if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        return SHA256
    return None


def same_inputs(a: object, b: object) -> bool | None:
    """Whether two recorded digests name the same input set: ``None`` when they are of different kinds (or
    either is missing), which says nothing about the inputs."""
    kind = digest_kind(a)
    if kind is None or kind != digest_kind(b):
        return None
    return a == b
