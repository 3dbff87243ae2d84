"""On-device dumps on the CUDA execution provider: every dumped tensor stays in GPU memory, fingerprinted there.

``DeviceDump`` binds every output of the exposed graph (``dump.DumpPlan``) with ONNX Runtime's IOBinding to
one preallocated CUDA buffer (1 KiB-aligned slices; reused by every step of the same size), runs the step,
and fingerprints every tensor — every sample of a batched tensor — with two CuPy ``RawKernel`` launches:

1. ``chunk_stats``: one block per chunk of 32 KiB of a tensor: the ``qc-mix64/1`` terms of its words
   (``kernels.py``; added modulo 2**64), min, max and sum of its values in float64 (a fixed reduction tree),
   NaN and Inf counts; one partial record per chunk (no atomics at all);
2. ``segment_reduce``: one thread per (tensor, sample) adds its chunks' partials in chunk order and
   finalizes the hash with the byte count.

Integer arithmetic for the hash and a fixed order for the float sums: the same bytes give the same record on
every run, whatever the scheduling. The hash is the CPU's (``kernels.mix64``), so a GPU dump and a CPU dump
compare hash for hash; min, max, NaN and Inf are exact; the mean of a float tensor may differ from the CPU's in
the last bits (summation order), that of an integer tensor is exact. Only the records (56 bytes per tensor per
sample), the final outputs (for the faithfulness check) and raw tensors asked for come back to the host —
and the tensors ORT holds in another axis order than the original model's (``relaid``, rare on the CUDA EP:
``prefer_nhwc``), which are put back in the original's order and fingerprinted on the host, as a host dump
records them.

CuPy (``cupy-cuda13x``, extra ``gpu``) is imported when a CUDA dump starts, never before: beside production's
session (``start``, a part of the run's start-up), so that the recorder finds it imported and its kernels loaded.
"""

from __future__ import annotations

import threading
import time
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from qconsist.errors import UnavailableError
from qconsist.inference.cupy_loader import import_cupy
from qconsist.inference.fingerprint import DTYPES, HASH_FUNCTION, RECORD, ShapeTable, fingerprint
from qconsist.inference.layout import to_original

log = logging.getLogger(__name__)

ALIGN = 1024  # bytes between the start of two tensors in the shared buffer
CHUNK_WORDS = 4096  # 32 KiB of a tensor per block
THREADS = 256
PINNED_COLUMN_BYTES = 1 << 20  # host columns up to this size come back asynchronously (final outputs); larger: at collect

_SOURCE = r"""
typedef unsigned long long u64;
#define K1 0x9E3779B97F4A7C15ULL
#define K2 0xC2B2AE3D27D4EB4FULL
__device__ __forceinline__ u64 fmix(u64 x) {
  x ^= x >> 33; x *= 0xFF51AFD7ED558CCDULL; x ^= x >> 33; x *= 0xC4CEB9FE1A85EC53ULL; x ^= x >> 33; return x;
}
__device__ __forceinline__ float half_to_float(unsigned int h) {
  unsigned int sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
  if (exp == 0) {
    if (man == 0) { bits = sign; }
    else { int e = -1; do { e++; man <<= 1; } while (!(man & 0x400u)); bits = sign | ((112 - e) << 23) | ((man & 0x3FFu) << 13); }
  } else if (exp == 31) { bits = sign | 0x7F800000u | (man << 13); }
  else { bits = sign | ((exp + 112) << 23) | (man << 13); }
  return __uint_as_float(bits);
}
// kind: the element type code of qconsist.inference.fingerprint.DTYPES
__device__ __forceinline__ double value_at(u64 word, int k, int kind, int* isfloat) {
  *isfloat = 0;
  switch (kind) {
    case 1: { *isfloat = 1; return (double)__uint_as_float((unsigned int)(word >> (32 * k))); }
    case 2: { *isfloat = 1; return __longlong_as_double((long long)word); }
    case 3: { *isfloat = 1; return (double)half_to_float((unsigned int)(word >> (16 * k)) & 0xFFFFu); }
    case 4: { *isfloat = 1; return (double)__uint_as_float(((unsigned int)(word >> (16 * k)) & 0xFFFFu) << 16); }
    case 5: return (double)(signed char)(word >> (8 * k));
    case 6: case 13: return (double)(unsigned char)(word >> (8 * k));
    case 7: return (double)(short)(word >> (16 * k));
    case 8: return (double)(unsigned short)(word >> (16 * k));
    case 9: return (double)(int)(word >> (32 * k));
    case 10: return (double)(unsigned int)(word >> (32 * k));
    case 11: return (double)(long long)word;
    case 12: return (double)word;
  }
  return 0.0;
}
__device__ __forceinline__ int item_size(int kind) {
  switch (kind) { case 1: case 9: case 10: return 4; case 2: case 11: case 12: return 8;
                  case 3: case 4: case 7: case 8: return 2; default: return 1; }
}
__device__ __forceinline__ int has_stats(int kind) { return kind >= 1 && kind <= 13; }

extern "C" __global__ void chunk_stats(
    const unsigned char* base, const long long* seg_offset, const long long* seg_bytes, const int* seg_kind,
    const int* chunk_segment, const long long* chunk_word, int words_per_chunk,
    u64* p_hash, double* p_lo, double* p_hi, double* p_sum, u64* p_nan, u64* p_inf) {
  __shared__ u64 s_hash[32]; __shared__ double s_lo[32]; __shared__ double s_hi[32]; __shared__ double s_sum[32];
  __shared__ u64 s_nan[32]; __shared__ u64 s_inf[32];
  int chunk = blockIdx.x, seg = chunk_segment[chunk], kind = seg_kind[seg];
  long long nbytes = seg_bytes[seg], nwords = (nbytes + 7) / 8;
  const unsigned char* p = base + seg_offset[seg];
  int aligned = (((unsigned long long)p) & 7) == 0;
  int size = item_size(kind), per = 8 / size, stats = has_stats(kind);
  long long first = chunk_word[chunk], last = min(first + (long long)words_per_chunk, nwords);
  u64 h = 0, nan = 0, inf = 0; double lo = 1.0 / 0.0, hi = -1.0 / 0.0, sum = 0.0;
  for (long long w = first + threadIdx.x; w < last; w += blockDim.x) {
    u64 word = 0;
    long long at = w * 8;
    if (aligned && at + 8 <= nbytes) { word = *(const u64*)(p + at); }
    else { for (int b = 0; b < 8 && at + b < nbytes; b++) word |= ((u64)p[at + b]) << (8 * b); }
    h += fmix(word ^ ((u64)(w + 1) * K1));
    if (stats) {
      int count = (int)min((long long)per, (nbytes - at) / size);
      for (int k = 0; k < count; k++) {
        int isfloat; double v = value_at(word, k, kind, &isfloat);
        if (isfloat && v != v) { nan++; }
        else if (isfloat && isinf(v)) { inf++; }
        else { lo = fmin(lo, v); hi = fmax(hi, v); sum += v; }
      }
    }
  }
  // warp, then block: a fixed tree, so the float sum is the same on every run
  for (int o = 16; o > 0; o >>= 1) {
    h += __shfl_down_sync(0xffffffffu, h, o); nan += __shfl_down_sync(0xffffffffu, nan, o);
    inf += __shfl_down_sync(0xffffffffu, inf, o); sum += __shfl_down_sync(0xffffffffu, sum, o);
    lo = fmin(lo, __shfl_down_sync(0xffffffffu, lo, o)); hi = fmax(hi, __shfl_down_sync(0xffffffffu, hi, o));
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) { s_hash[warp] = h; s_lo[warp] = lo; s_hi[warp] = hi; s_sum[warp] = sum; s_nan[warp] = nan; s_inf[warp] = inf; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < warps; i++) {
      h += s_hash[i]; lo = fmin(lo, s_lo[i]); hi = fmax(hi, s_hi[i]); sum += s_sum[i]; nan += s_nan[i]; inf += s_inf[i];
    }
    p_hash[chunk] = h; p_lo[chunk] = lo; p_hi[chunk] = hi; p_sum[chunk] = sum; p_nan[chunk] = nan; p_inf[chunk] = inf;
  }
}

extern "C" __global__ void segment_reduce(
    int segments, const long long* seg_bytes, const int* seg_kind, const int* seg_first_chunk,
    const u64* p_hash, const double* p_lo, const double* p_hi, const double* p_sum, const u64* p_nan, const u64* p_inf,
    u64* o_hash, double* o_lo, double* o_hi, double* o_mean, u64* o_nan, u64* o_inf) {
  int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= segments) return;
  u64 h = 0, nan = 0, inf = 0; double lo = 1.0 / 0.0, hi = -1.0 / 0.0, sum = 0.0;
  for (int c = seg_first_chunk[s]; c < seg_first_chunk[s + 1]; c++) {
    h += p_hash[c]; lo = fmin(lo, p_lo[c]); hi = fmax(hi, p_hi[c]); sum += p_sum[c]; nan += p_nan[c]; inf += p_inf[c];
  }
  long long nbytes = seg_bytes[s];
  o_hash[s] = fmix(h ^ ((u64)nbytes * K2));
  long long finite = nbytes / item_size(seg_kind[s]) - (long long)(nan + inf);
  double nothing = __longlong_as_double(0x7FF8000000000000LL);
  int stats = has_stats(seg_kind[s]) && finite > 0;
  o_lo[s] = stats ? lo : nothing; o_hi[s] = stats ? hi : nothing; o_mean[s] = stats ? sum / (double)finite : nothing;
  o_nan[s] = nan; o_inf[s] = inf;
}

// One launch per step over the whole exposed arena: every block fingerprints its chunk (as chunk_stats), and the
// block that finishes a segment's last chunk reduces the segment's partials in chunk order (as segment_reduce),
// whichever block that is: the counter decides who reduces, never the order of the sums, so the records are
// those of the two kernels above, bit for bit. The counters are left at zero for the next step.
extern "C" __global__ void fingerprint_arena(
    const unsigned char* base, const long long* seg_offset, const long long* seg_bytes, const int* seg_kind,
    const int* seg_first_chunk, const int* chunk_segment, const long long* chunk_word, int words_per_chunk,
    u64* p_hash, double* p_lo, double* p_hi, double* p_sum, u64* p_nan, u64* p_inf, unsigned int* seg_done,
    u64* o_hash, double* o_lo, double* o_hi, double* o_mean, u64* o_nan, u64* o_inf) {
  __shared__ u64 s_hash[32]; __shared__ double s_lo[32]; __shared__ double s_hi[32]; __shared__ double s_sum[32];
  __shared__ u64 s_nan[32]; __shared__ u64 s_inf[32]; __shared__ int s_last;
  int chunk = blockIdx.x, seg = chunk_segment[chunk], kind = seg_kind[seg];
  long long nbytes = seg_bytes[seg], nwords = (nbytes + 7) / 8;
  const unsigned char* p = base + seg_offset[seg];
  int aligned = (((unsigned long long)p) & 7) == 0;
  int size = item_size(kind), per = 8 / size, stats = has_stats(kind);
  long long first = chunk_word[chunk], last = min(first + (long long)words_per_chunk, nwords);
  u64 h = 0, nan = 0, inf = 0; double lo = 1.0 / 0.0, hi = -1.0 / 0.0, sum = 0.0;
  for (long long w = first + threadIdx.x; w < last; w += blockDim.x) {
    u64 word = 0;
    long long at = w * 8;
    if (aligned && at + 8 <= nbytes) { word = *(const u64*)(p + at); }
    else { for (int b = 0; b < 8 && at + b < nbytes; b++) word |= ((u64)p[at + b]) << (8 * b); }
    h += fmix(word ^ ((u64)(w + 1) * K1));
    if (stats) {
      int count = (int)min((long long)per, (nbytes - at) / size);
      for (int k = 0; k < count; k++) {
        int isfloat; double v = value_at(word, k, kind, &isfloat);
        if (isfloat && v != v) { nan++; }
        else if (isfloat && isinf(v)) { inf++; }
        else { lo = fmin(lo, v); hi = fmax(hi, v); sum += v; }
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    h += __shfl_down_sync(0xffffffffu, h, o); nan += __shfl_down_sync(0xffffffffu, nan, o);
    inf += __shfl_down_sync(0xffffffffu, inf, o); sum += __shfl_down_sync(0xffffffffu, sum, o);
    lo = fmin(lo, __shfl_down_sync(0xffffffffu, lo, o)); hi = fmax(hi, __shfl_down_sync(0xffffffffu, hi, o));
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) { s_hash[warp] = h; s_lo[warp] = lo; s_hi[warp] = hi; s_sum[warp] = sum; s_nan[warp] = nan; s_inf[warp] = inf; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < warps; i++) {
      h += s_hash[i]; lo = fmin(lo, s_lo[i]); hi = fmax(hi, s_hi[i]); sum += s_sum[i]; nan += s_nan[i]; inf += s_inf[i];
    }
    p_hash[chunk] = h; p_lo[chunk] = lo; p_hi[chunk] = hi; p_sum[chunk] = sum; p_nan[chunk] = nan; p_inf[chunk] = inf;
    __threadfence();
    int chunks = seg_first_chunk[seg + 1] - seg_first_chunk[seg];
    s_last = atomicAdd(&seg_done[seg], 1u) == (unsigned int)(chunks - 1);
  }
  __syncthreads();
  if (threadIdx.x != 0 || !s_last) return;
  __threadfence();
  const volatile u64* vh = p_hash; const volatile double* vlo = p_lo; const volatile double* vhi = p_hi;
  const volatile double* vsum = p_sum; const volatile u64* vnan = p_nan; const volatile u64* vinf = p_inf;
  h = 0; nan = 0; inf = 0; lo = 1.0 / 0.0; hi = -1.0 / 0.0; sum = 0.0;
  for (int c = seg_first_chunk[seg]; c < seg_first_chunk[seg + 1]; c++) {
    h += vh[c]; lo = fmin(lo, vlo[c]); hi = fmax(hi, vhi[c]); sum += vsum[c]; nan += vnan[c]; inf += vinf[c];
  }
  o_hash[seg] = fmix(h ^ ((u64)nbytes * K2));
  long long finite = nbytes / size - (long long)(nan + inf);
  double nothing = __longlong_as_double(0x7FF8000000000000LL);
  int has = stats && finite > 0;
  o_lo[seg] = has ? lo : nothing; o_hi[seg] = has ? hi : nothing; o_mean[seg] = has ? sum / (double)finite : nothing;
  o_nan[seg] = nan; o_inf[seg] = inf;
  seg_done[seg] = 0;
}
"""

_module: dict[str, Any] = {}
_loading = threading.Lock()  # one load of the kernels: ``start``'s in a start-up thread, or the recorder's


def _cupy() -> Any:
    try:
        cupy = import_cupy()
    except ImportError as exc:
        raise UnavailableError(f"on-device dumps need CuPy for CUDA 13: install qconsist[gpu] (cupy-cuda13x) ({exc})") from None
    with _loading:  # the recorder's start waits here for a load ``start`` has begun
        if not _module:
            raw = cupy.RawModule(code=_SOURCE, options=("-std=c++14",))
            _module.update(chunk_stats=raw.get_function("chunk_stats"), segment_reduce=raw.get_function("segment_reduce"),
                           fingerprint_arena=raw.get_function("fingerprint_arena"))
    return cupy


def start(device_id: int) -> None:
    """CuPy imported and the kernels loaded on GPU ``device_id`` (its context made) now, in a thread beside the run's
    start-up, so that ``DeviceDump`` — the recorder's start on the main thread — finds them (0.93 s of an H200 run's
    start-up on the main thread before). A failure is left to that start: ``_cupy`` there tries again and raises its
    error at the recorder's place in the start-up, as it did when nothing began it earlier."""
    try:
        cupy = import_cupy()
        with cupy.cuda.Device(device_id):
            _cupy()
    except Exception as exc:  # noqa: BLE001 - raised again, in its place, by the recorder's start
        log.debug("dump: CuPy's start beside the start-up failed (%s); the recorder's start says why", exc)


@dataclass
class _Layout:
    """The buffer, bindings and work tables of steps of one size."""

    count: int
    binding: Any
    buffer: Any  # cupy uint8 array
    shapes: list[tuple[int, ...]]  # per column, the whole step
    offsets: list[int]
    nbytes: list[int]
    segments: list[tuple[int, int]]  # per column: (first segment, segments: count or 1)
    tables: dict[str, Any]  # device arrays of the kernels
    row_shapes: list[int]  # per column: shape id of one sample's tensor
    chunks: int

    def pinned(self, cp: Any, host_columns: Sequence[int], numpy_types: Sequence[Any]) -> dict:
        """Pinned host arrays the step's results are copied into: ``out`` (the kernel's records) and every host
        column of at most ``PINNED_COLUMN_BYTES`` bytes (final outputs) of a type numpy names; made once per
        set of columns."""
        key = tuple(host_columns)
        cache = self.__dict__.setdefault("_pinned", {})
        found = cache.get(key)
        if found is None:
            segments = int(self.tables["seg_bytes"].size)
            found = {"out": _pinned(cp, 6 * segments * 8).view(np.uint64).reshape(6, segments)}
            for c in host_columns:
                if numpy_types[c] is not None and self.nbytes[c] <= PINNED_COLUMN_BYTES:
                    found[c] = _pinned(cp, self.nbytes[c])
            cache[key] = found
        return found

    @property
    def gather(self) -> np.ndarray:
        """``int64[count, tensors]``: the segment holding each (sample, tensor) record (a column not split by
        sample: its one segment for every sample)."""
        found = getattr(self, "_gather", None)
        if found is None:
            found = np.empty((self.count, len(self.segments)), dtype=np.int64)
            for column, (first, parts) in enumerate(self.segments):
                found[:, column] = np.arange(first, first + parts) if parts == self.count else first
            self._gather = found
        return found


class DeviceDump:
    """Runs the exposed graph with every output bound to CUDA memory and fingerprints it there."""

    def __init__(self, session: Any, names: Sequence[str], dtypes: Sequence[str], batched: Sequence[bool],
                 shapes: ShapeTable, device_id: int = 0, relaid: dict[int, tuple[int, ...]] | None = None) -> None:
        self.relaid = dict(relaid or {})  # column -> layout permutation (``dump.DumpPlan.relaid``)
        self.cp = _cupy()
        self.session, self.names, self.batched = session, list(names), list(batched)
        self.codes = [DTYPES.index(d) if d in DTYPES else 0 for d in dtypes]
        self.numpy_types = [np.dtype(d) if d in DTYPES[1:] and d not in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else None
                            for d in dtypes]
        self.device_id, self.shape_table = device_id, shapes
        self._layouts: dict[int, _Layout] = {}
        self._pending: tuple | None = None  # the step submitted last: (layout, count, host columns, (event, pinned))
        self._stream: Any = None  # the fingerprints' CUDA stream (made at the first step)
        self.seconds = {"exposure": 0.0, "fingerprints": 0.0, "transfers": 0.0}

    # ------------------------------------------------------------------ layout
    def _learn(self, step: dict[str, np.ndarray], count: int) -> _Layout:
        cp = self.cp
        probe = self.session.io_binding()
        for name, array in step.items():
            probe.bind_cpu_input(name, array)
        for name in self.names:
            probe.bind_output(name, "cuda", self.device_id)
        self.session.run_with_iobinding(probe)
        shapes = [tuple(int(d) for d in v.shape()) for v in probe.get_outputs()]
        del probe
        offsets, nbytes, total = [], [], 0
        for shape, code in zip(shapes, self.codes):
            size = int(np.prod(shape, dtype=np.int64)) * _itemsize(code)
            offsets.append(total)
            nbytes.append(size)
            total += (size + ALIGN - 1) // ALIGN * ALIGN
        buffer = cp.empty(max(total, ALIGN), dtype=cp.uint8)
        binding = self.session.io_binding()
        for name, shape, code, offset, numpy_type in zip(self.names, shapes, self.codes, offsets, self.numpy_types):
            if numpy_type is None:
                binding.bind_output(name, "cuda", self.device_id)  # a type numpy cannot name: ORT allocates
            else:
                binding.bind_output(name, "cuda", self.device_id, numpy_type, list(shape), buffer.data.ptr + offset)
        seg_offset, seg_bytes, seg_kind, segments, row_shapes = [], [], [], [], []
        for column, (shape, offset, size) in enumerate(zip(shapes, offsets, nbytes)):
            split = count > 1 and self.batched[column] and len(shape) > 0 and shape[0] == count
            rows = count if split else 1
            segments.append((len(seg_offset), rows))
            row_shapes.append(self.shape_table.id((1, *shape[1:]) if split else shape))
            for r in range(rows):
                seg_offset.append(offset + r * (size // rows))
                seg_bytes.append(size // rows)
                seg_kind.append(self.codes[column])
        first_chunk, chunk_segment, chunk_word = [0], [], []
        for s, size in enumerate(seg_bytes):
            words = (size + 7) // 8
            for w in range(0, max(words, 1), CHUNK_WORDS):  # an empty tensor: one chunk without words
                chunk_segment.append(s)
                chunk_word.append(w)
            first_chunk.append(len(chunk_segment))
        chunks, n = len(chunk_segment), len(seg_offset)
        tables = {
            "seg_offset": cp.asarray(np.array(seg_offset, dtype=np.int64)),
            "seg_bytes": cp.asarray(np.array(seg_bytes, dtype=np.int64)),
            "seg_kind": cp.asarray(np.array(seg_kind, dtype=np.int32)),
            "first_chunk": cp.asarray(np.array(first_chunk, dtype=np.int32)),
            "chunk_segment": cp.asarray(np.array(chunk_segment or [0], dtype=np.int32)),
            "chunk_word": cp.asarray(np.array(chunk_word or [0], dtype=np.int64)),
            "p_hash": cp.empty(max(chunks, 1), cp.uint64), "p_lo": cp.empty(max(chunks, 1), cp.float64),
            "p_hi": cp.empty(max(chunks, 1), cp.float64), "p_sum": cp.empty(max(chunks, 1), cp.float64),
            "p_nan": cp.empty(max(chunks, 1), cp.uint64), "p_inf": cp.empty(max(chunks, 1), cp.uint64),
            "out": cp.empty((6, n), cp.uint64),  # hash, lo, hi, mean (float64 bits), nan, inf
            "seg_done": cp.zeros(max(n, 1), cp.uint32),  # fingerprint_arena's counters (left at zero by it)
        }
        log.info("device dump: %d tensors, %.1f MB per step of %d, %d segments, %d chunks", len(shapes), total / 1e6, count, n, chunks)
        return _Layout(count, binding, buffer, shapes, offsets, nbytes, segments, tables, row_shapes, chunks)

    # ------------------------------------------------------------------ one step
    def run(self, step: dict[str, np.ndarray], count: int, host_columns: Sequence[int] = ()) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Run one step: its records ``RECORD[count, tensors]`` and the whole-step arrays of ``host_columns``
        (``submit`` and ``collect`` at once: the step's records before the call returns)."""
        earlier = self.submit(step, count, host_columns)
        assert earlier is None, "run() after submit(): collect() the submitted step first"
        found = self.collect()
        assert found is not None
        return found

    def submit(self, step: dict[str, np.ndarray], count: int,
               host_columns: Sequence[int] = ()) -> tuple[np.ndarray, dict[int, np.ndarray]] | None:
        """Run one step in the exposed session and start its fingerprints on the GPU without waiting for them;
        returns the records and host arrays of the step submitted before (``None`` for the first), which are
        collected before this step's tensors overwrite the buffer.

        The step's fingerprints run (one ``fingerprint_arena`` launch) on a stream of their own while the host
        goes on — to production's run of the step and the recording of the previous one; their records (a few
        KB) and the final outputs are copied into pinned host memory on that stream; the next ``submit``
        (or ``collect``) waits on the stream's event, by then long passed. No other host synchronisation."""
        earlier = self.collect()
        layout = self._layouts.get(count)
        if layout is None:
            layout = self._layouts[count] = self._learn(step, count)
        start = time.perf_counter()
        for name, array in step.items():
            layout.binding.bind_cpu_input(name, array)
        self.session.run_with_iobinding(layout.binding)
        layout.binding.synchronize_outputs()  # ORT's stream has written the buffer (ORT's run already waited: no cost)
        middle = time.perf_counter()
        self._pending = (layout, count, tuple(host_columns), self._launch(layout, count, host_columns))
        self.seconds["exposure"] += middle - start
        self.seconds["fingerprints"] += time.perf_counter() - middle
        return earlier

    def collect(self) -> tuple[np.ndarray, dict[int, np.ndarray]] | None:
        """The records and host arrays of the step submitted last, once its stream reached them (``None``: none)."""
        if self._pending is None:
            return None
        layout, count, host_columns, (event, pinned) = self._pending
        self._pending = None
        start = time.perf_counter()
        event.synchronize()
        finished = time.perf_counter()
        result = pinned["out"]
        host = {c: pinned[c].view(self.numpy_types[c]).reshape(layout.shapes[c]).copy() for c in pinned if c != "out"}
        for c in sorted((set(host_columns) | set(self.relaid)) - set(host)):
            host[c] = self._host(layout, c)  # the buffer still holds the step: the next one has not run
        done = time.perf_counter()
        self.seconds["fingerprints"] += finished - start
        self.seconds["transfers"] += done - finished
        records = self._records(layout, result, count)
        for column, perm in self.relaid.items():
            host[column] = whole = to_original(host[column], perm)
            split = count > 1 and self.batched[column] and whole.ndim > 0 and whole.shape[0] == count
            for row in range(count):
                array = whole[row:row + 1] if split else whole
                records[row, column] = fingerprint(array, self.shape_table.id(array.shape))
        return records, {c: host[c] for c in host_columns}

    def _launch(self, layout: _Layout, count: int, host_columns: Sequence[int]) -> tuple[Any, dict]:
        """Queue the step's fingerprint kernel and the copies of its records and small host columns (final
        outputs) into pinned memory on the dump's stream; the event that marks their end, and the pinned arrays."""
        cp = self.cp
        t = layout.tables
        if self._stream is None:
            self._stream = cp.cuda.Stream(non_blocking=True)
        with self._stream:
            out = t["out"]
            _module["fingerprint_arena"]((layout.chunks,), (THREADS,), (
                layout.buffer, t["seg_offset"], t["seg_bytes"], t["seg_kind"], t["first_chunk"], t["chunk_segment"],
                t["chunk_word"], np.int32(CHUNK_WORDS), t["p_hash"], t["p_lo"], t["p_hi"], t["p_sum"], t["p_nan"],
                t["p_inf"], t["seg_done"], out[0], out[1].view(cp.float64), out[2].view(cp.float64),
                out[3].view(cp.float64), out[4], out[5]))
            pinned = layout.pinned(cp, host_columns, self.numpy_types)
            # blocking=False: CuPy's get waits for the stream by default (1.7 ms a call on the H200, the kernel's
            # time: it was not overlapped at all); ``collect`` waits on the event instead, a step later
            out.get(stream=self._stream, out=pinned["out"], blocking=False)
            for c in pinned:
                if c != "out":
                    layout.buffer[layout.offsets[c]:layout.offsets[c] + layout.nbytes[c]].get(
                        stream=self._stream, out=pinned[c], blocking=False)
            event = self._stream.record()
        return event, pinned

    def _host(self, layout: _Layout, column: int) -> np.ndarray:
        numpy_type = self.numpy_types[column]
        if numpy_type is None:
            return layout.binding.get_outputs()[column].numpy()
        size = layout.nbytes[column]
        raw = layout.buffer[layout.offsets[column]:layout.offsets[column] + size].get()
        return raw.view(numpy_type).reshape(layout.shapes[column])

    def _records(self, layout: _Layout, result: np.ndarray, count: int) -> np.ndarray:
        """``RECORD[count, tensors]`` from the kernels' per-segment results (``result``: hash, min, max, mean as
        float64 bits, NaN and Inf counts): one gather per field through the layout's segment index."""
        index = layout.gather
        rows = np.zeros(index.shape, dtype=RECORD)
        floats = result[1:4].view(np.float64)
        rows["hash"] = result[0][index]
        rows["min"], rows["max"], rows["mean"] = floats[0][index], floats[1][index], floats[2][index]
        rows["nan"], rows["inf"] = result[4][index], result[5][index]
        rows["shape"] = np.asarray(layout.row_shapes, dtype=np.uint32)
        rows["dtype"] = np.asarray(self.codes, dtype=np.uint16)
        rows["present"], rows["function"] = 1, HASH_FUNCTION
        return rows


def _pinned(cp: Any, nbytes: int) -> np.ndarray:
    """``uint8[nbytes]`` in page-locked host memory (CuPy's pinned pool; ``cupyx.empty_pinned`` would import
    cupyx, 0.7 s, in the first step)."""
    memory = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
    return np.frombuffer(memory, np.uint8, max(nbytes, 1))[:nbytes]


def _itemsize(code: int) -> int:
    name = DTYPES[code] if 0 < code < len(DTYPES) else ""
    return {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}.get(name) or (np.dtype(name).itemsize if name else 1)

