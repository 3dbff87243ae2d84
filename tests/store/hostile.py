"""Hostile run directories: each case damages a copy of the small runs (``conftest.runs_copy``), runs one
command on it, and states the one line that command must print (exit 2). ``tests/store/test_hostile.py``
asserts them; ``python tests/store/hostile.py`` is not needed: the closing note's table is this list."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

Paths = dict[str, Path]


def edit(run: Path, change: Callable[[dict], None]) -> None:
    path = run / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def rehash(run: Path, relative: str) -> None:
    """Cover the tracks: record the damaged file's own hashes in the manifest, as an attacker would."""
    blob = (run / relative).read_bytes()

    def change(data: dict) -> None:
        data["files"][relative] = {"sha256": hashlib.sha256(blob).hexdigest(), "md5": hashlib.md5(blob).hexdigest(),
                                   "size": len(blob)}
        for stage in data["stages"]:
            artifact = stage.get("artifact")
            if isinstance(artifact, dict) and artifact.get("path") == relative:
                artifact["sha256"] = hashlib.sha256(blob).hexdigest()
    edit(run, change)


def stage(data: dict, name: str) -> dict:
    return next(s for s in data["stages"] if s["name"] == name)


def _set_artifact_path(value):
    return lambda p: edit(p["pipeline2"], lambda d: stage(d, "quantize")["artifact"].__setitem__("path", value))


def _replace(run_key: str, relative: str, writer: Callable[[Path, Paths], None]):
    def mutate(p: Paths) -> None:
        target = p[run_key] / relative
        target.unlink()
        writer(target, p)
    return mutate


def _npy_with_header(target: Path, header_shape: tuple, data_rows: int, dtype=None) -> None:
    """A fingerprint table whose header says ``header_shape`` while the file holds ``data_rows`` rows."""
    from qconsist.inference.fingerprint import RECORD

    dtype = RECORD if dtype is None else dtype
    real = np.zeros((data_rows, header_shape[1]), dtype=dtype)
    with open(target, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                      "fortran_order": False, "shape": header_shape})
        handle.write(real.tobytes())


# Runs written before one file per output and the compact fingerprint table (``legacy2``: a copy of
# tests/data/old_runs/v1570-b) are read as safely as new ones: their old files get the same damage.
LEGACY_TABLE = "dump/fingerprints.npy"
HASHES = "dump/table/hashes.npy"


def _lying_table(p: Paths, key: str = "legacy2", relative: str = LEGACY_TABLE, dtype=None) -> None:
    target = p[key] / relative
    shape = np.load(target, mmap_mode="r").shape
    _npy_with_header(target, (1000000, shape[1]), shape[0], dtype)
    rehash(p[key], relative)


def _wrong_dtype_table(p: Paths, key: str = "legacy2", relative: str = LEGACY_TABLE) -> None:
    target = p[key] / relative
    table = np.load(target)
    np.save(target, np.zeros(table.shape, dtype=np.float64))
    rehash(p[key], relative)


def _truncated_table(p: Paths, key: str = "legacy2", relative: str = LEGACY_TABLE) -> None:
    target = p[key] / relative
    blob = target.read_bytes()
    target.write_bytes(blob[: len(blob) - 100])


def _truncated_table_rehashed(p: Paths, key: str = "legacy2", relative: str = LEGACY_TABLE) -> None:
    _truncated_table(p, key, relative)
    rehash(p[key], relative)


def _lying_npz_member(p: Paths) -> None:
    target = p["legacy2"] / "outputs" / "000000.npz"
    with zipfile.ZipFile(target) as archive:
        names = archive.namelist()
    with zipfile.ZipFile(target, "w") as archive:
        for name in names:
            with archive.open(name, "w") as handle:
                np.lib.format.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
                handle.write(b"\0" * 20)
    rehash(p["legacy2"], "outputs/000000.npz")


def _not_a_zip(p: Paths) -> None:
    (p["legacy2"] / "outputs" / "000000.npz").write_bytes(b"PK\x03\x04 not really a zip")
    rehash(p["legacy2"], "outputs/000000.npz")


def _pickled_output(p: Paths) -> None:
    target = p["legacy2"] / "outputs" / "000000.npz"
    with zipfile.ZipFile(target) as archive:
        names = archive.namelist()
    with zipfile.ZipFile(target, "w") as archive:
        for name in names:
            with archive.open(name, "w") as handle:
                np.lib.format.write_array(handle, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    rehash(p["legacy2"], "outputs/000000.npz")


def _output_file(p: Paths, writer: Callable[[Path], None]) -> None:
    """Damage the new run's one file of output 0 (``outputs/o0.npy``), the manifest rehashed."""
    writer(p["inference2"] / "outputs" / "o0.npy")
    rehash(p["inference2"], "outputs/o0.npy")


def _lying_output_header(target: Path) -> None:
    with open(target, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40, 1, 5)})
        handle.write(b"\0" * 20)


def _pickled_output_file(target: Path) -> None:
    with open(target, "wb") as handle:
        np.lib.format.write_array(handle, np.array([{"a": 1}], dtype=object), allow_pickle=True)


def _fewer_output_samples(target: Path) -> None:
    np.save(target, np.load(target)[:2])


def _event_of_no_tensor(events: np.ndarray) -> np.ndarray:
    more = np.concatenate([events, events[-1:]])
    more["column"][-1] = 999
    return more


def _table_file(p: Paths, relative: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Replace a file of the new run's compact fingerprint table by ``change`` of its array, rehashed."""
    target = p["inference2"] / relative
    np.save(target, change(np.load(target)))
    rehash(p["inference2"], relative)


def _swap(p: Paths) -> None:
    run = p["pipeline2"]
    a, b = run / "quantize" / "model.onnx", run / "optimize" / "model.onnx"
    tmp = run / "swap.tmp"
    os.replace(a, tmp)
    os.replace(b, a)
    os.replace(tmp, b)


def _extra_raw(p: Paths) -> None:
    run = p["inference2"]
    shutil.copyfile(run / "dump" / "raw" / "000000.npz", run / "dump" / "raw" / "000007.npz")
    edit(run, lambda d: d["sections"]["inference"].__setitem__("samples", 8))


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Paths], None]
    command: Callable[[Paths], list[str]]
    message: Callable[[Paths], str]  # the one line on stderr (a regular expression), exit 2
    env: dict[str, str] | None = None


def diff_pipelines(p: Paths) -> list[str]:
    return ["diff", str(p["pipeline"]), str(p["pipeline2"])]


def diff_inference(p: Paths) -> list[str]:
    return ["diff", str(p["inference"]), str(p["inference2"])]


def diff_legacy(p: Paths) -> list[str]:
    return ["diff", str(p["legacy"]), str(p["legacy2"])]


def _q(p: Paths) -> str:
    return str(p["pipeline2"])


def _i(p: Paths) -> str:
    return str(p["inference2"])


def _l(p: Paths) -> str:
    return str(p["legacy2"])


SHA = "<sha>"  # tokens in messages: <sha> a 12-digit hash prefix and "…", <n> a number, <any> any text

CASES: list[Case] = [
    Case("replaced artifact (diff)", _replace("pipeline2", "quantize/model.onnx", lambda t, p: shutil.copyfile(p["pipeline2"] / "optimize" / "model.onnx", t)),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("replaced artifact (gate)", _replace("pipeline2", "quantize/model.onnx", lambda t, p: shutil.copyfile(p["pipeline2"] / "optimize" / "model.onnx", t)),
         lambda p: ["gate", str(p["pipeline2"]), "--baseline", str(p["pipeline"])],
         lambda p: f"run {_q(p)}: quantize/model.onnx was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("replaced artifact (run RUN)", _replace("pipeline2", "quantize/model.onnx", lambda t, p: shutil.copyfile(p["pipeline2"] / "optimize" / "model.onnx", t)),
         lambda p: ["run", str(p["pipeline2"]), "--inputs", str(p["data"]), "--runs-dir", str(p["runs"])],
         lambda p: f"run {_q(p)}: quantize/model.onnx was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("replaced artifact (report)", _replace("pipeline2", "quantize/model.onnx", lambda t, p: shutil.copyfile(p["pipeline2"] / "optimize" / "model.onnx", t)),
         lambda p: ["report", str(p["pipeline2"]), "-o", str(p["outside"] / "r.html")],
         lambda p: f"run {_q(p)}: quantize/model.onnx was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("replaced artifact (verify)", _replace("pipeline2", "quantize/model.onnx", lambda t, p: shutil.copyfile(p["pipeline2"] / "optimize" / "model.onnx", t)),
         lambda p: ["verify", str(p["pipeline2"])],
         lambda p: f"run {_q(p)}: quantize/model.onnx was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("one byte appended to an artifact", lambda p: (p["pipeline2"] / "convert" / "model.onnx").open("ab").write(b"\0"),
         diff_pipelines, lambda p: f"run {_q(p)}: convert/model.onnx was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("two artifacts swapped", _swap, diff_pipelines,
         lambda p: f"run {_q(p)}: optimize/model.onnx was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("artifact path ../../etc/passwd", _set_artifact_path("../../etc/passwd"), diff_pipelines,
         lambda p: f"run {_q(p)}: the manifest's quantize artifact path '../../etc/passwd' leaves the run directory ('..')"),
    Case("artifact path ../../etc/passwd (run RUN)", _set_artifact_path("../../etc/passwd"),
         lambda p: ["run", str(p["pipeline2"]), "--inputs", str(p["data"]), "--runs-dir", str(p["runs"])],
         lambda p: f"run {_q(p)}: the manifest's quantize artifact path '../../etc/passwd' leaves the run directory ('..')"),
    Case("artifact path absolute", _set_artifact_path("/etc/passwd"), diff_pipelines,
         lambda p: f"run {_q(p)}: the manifest's quantize artifact path '/etc/passwd' is absolute; paths in a run directory are relative to it"),
    Case("artifact path not normalised", _set_artifact_path("quantize/./model.onnx"), diff_pipelines,
         lambda p: f"run {_q(p)}: the manifest's quantize artifact path 'quantize/./model.onnx' is not normalised"),
    Case("artifact path with a backslash", _set_artifact_path("quantize\\model.onnx"), diff_pipelines,
         lambda p: f"run {_q(p)}: the manifest's quantize artifact path 'quantize\\\\model.onnx' is not a plain relative path"),
    Case("artifact path null (was: Load model from None)", _set_artifact_path(None), diff_pipelines,
         lambda p: f"{_q(p)}/manifest.json: stages[2].artifact.path must be a string"),
    Case("artifact a string (was: 'str' object has no attribute 'get')",
         lambda p: edit(p["pipeline2"], lambda d: stage(d, "quantize").__setitem__("artifact", "quantize/model.onnx")),
         diff_pipelines, lambda p: f"{_q(p)}/manifest.json: stages[2].artifact must be an object"),
    Case("artifact a symlink to a file outside", _replace("pipeline2", "quantize/model.onnx", lambda t, p: t.symlink_to(p["outside"] / "secret.onnx")),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx is a symbolic link pointing outside the run directory (to {p['outside'] / 'secret.onnx'}); refused"),
    Case("artifact folder a symlink outside", lambda p: (shutil.rmtree(p["pipeline2"] / "quantize"), (p["pipeline2"] / "quantize").symlink_to(p["outside"])),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx is a symbolic link pointing outside the run directory (to {p['outside']}); refused"),
    Case("artifact a symlink to /dev/zero", _replace("pipeline2", "quantize/model.onnx", lambda t, p: t.symlink_to("/dev/zero")),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx is a symbolic link pointing outside the run directory (to /dev/zero); refused"),
    Case("artifact a named pipe", _replace("pipeline2", "quantize/model.onnx", lambda t, p: os.mkfifo(t)),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx is a pipe; refused"),
    Case("artifact a directory", _replace("pipeline2", "quantize/model.onnx", lambda t, p: t.mkdir()),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx is a directory; refused"),
    Case("artifact missing", lambda p: (p["pipeline2"] / "quantize" / "model.onnx").unlink(),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx is missing"),
    Case("manifest a symlink outside", lambda p: ((p["outside"] / "m.json").write_text((p["pipeline2"] / "manifest.json").read_text()),
                                                   (p["pipeline2"] / "manifest.json").unlink(),
                                                   (p["pipeline2"] / "manifest.json").symlink_to(p["outside"] / "m.json")),
         diff_pipelines, lambda p: f"run {_q(p)}: manifest.json is a symbolic link pointing outside the run directory (to {p['outside'] / 'm.json'}); refused"),
    Case("manifest truncated", lambda p: (p["pipeline2"] / "manifest.json").write_text((p["pipeline2"] / "manifest.json").read_text()[:500]),
         diff_pipelines, lambda p: f"{_q(p)}/manifest.json: not valid JSON (<any>)"),
    Case("manifest a directory", lambda p: ((p["pipeline2"] / "manifest.json").unlink(), (p["pipeline2"] / "manifest.json").mkdir()),
         diff_pipelines, lambda p: f"run {_q(p)}: manifest.json is a directory; refused"),
    Case("recorded sha256 not a hash", lambda p: edit(p["pipeline2"], lambda d: d["files"]["quantize/model.onnx"].__setitem__("sha256", "x")),
         diff_pipelines, lambda p: f"{_q(p)}/manifest.json: files['quantize/model.onnx'] must record a sha256 (64 hex digits) and a size"),
    Case("recorded sha256 of another file", lambda p: edit(p["pipeline2"], lambda d: stage(d, "quantize")["artifact"].__setitem__("sha256", "0" * 64)),
         diff_pipelines, lambda p: f"run {_q(p)}: quantize/model.onnx was modified after the run (sha256 000000000000… recorded, {SHA} found)"),
    Case("calibration table entry a string (was: 'str' object has no attribute 'get')",
         lambda p: edit(p["pipeline2"], lambda d: d["calibration"]["table"].__setitem__(next(iter(d["calibration"]["table"])), "oops")),
         diff_pipelines, lambda p: f"{_q(p)}/manifest.json: calibration.table must map each tensor to an object"),
    Case("manifest stages an object", lambda p: edit(p["pipeline2"], lambda d: d.__setitem__("stages", {})),
         diff_pipelines, lambda p: f"{_q(p)}/manifest.json: 'stages' must be a JSON list"),
    Case("unknown schema", lambda p: edit(p["pipeline2"], lambda d: d.__setitem__("schema", "qconsist.run/9")),
         diff_pipelines, lambda p: f"{_q(p)}/manifest.json: schema 'qconsist.run/9' is not supported by this qconsist (reads qconsist.run/1)"),
    Case("oversized artifact", lambda p: None,
         diff_pipelines, lambda p: f"run {p['pipeline']}: convert/model.onnx is <n> bytes, more than the limit of 100 (QCONSIST_MAX_FILE_BYTES); refused",
         env={"QCONSIST_MAX_FILE_BYTES": "100"}),
    Case("dump section without its index (was: KeyError 'index')", lambda p: edit(p["inference2"], lambda d: d["sections"]["dump"].pop("index")),
         diff_inference, lambda p: f"run {_i(p)}: the manifest's dump section has no 'index' (a damaged manifest)"),
    Case("dump index path leaves the run", lambda p: edit(p["inference2"], lambda d: d["sections"]["dump"].__setitem__("index", "../inference/dump/index.json")),
         diff_inference, lambda p: f"run {_i(p)}: the manifest's dump index path '../inference/dump/index.json' leaves the run directory ('..')"),
    Case("dump section a string", lambda p: edit(p["inference2"], lambda d: d["sections"].__setitem__("dump", "dump/index.json")),
         diff_inference, lambda p: f"{_i(p)}/manifest.json: sections.dump must be a JSON object"),
    Case("fingerprint table truncated", _truncated_table, diff_legacy,
         lambda p: f"run {_l(p)}: dump/fingerprints.npy was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("fingerprint table truncated, manifest rehashed", _truncated_table_rehashed, diff_legacy,
         lambda p: f"run {_l(p)}: dump/fingerprints.npy: its header says (8, <n>) [<any>] (<n> bytes with the header), the file holds <n>; refused"),
    Case("fingerprint header lies about its shape, manifest rehashed", _lying_table, diff_legacy,
         lambda p: f"run {_l(p)}: dump/fingerprints.npy: its header says (1000000, <n>) [<any>] (<n> bytes with the header), the file holds <n>; refused"),
    Case("fingerprint table of another dtype, manifest rehashed", _wrong_dtype_table, diff_legacy,
         lambda p: f"run {_l(p)}: cannot read the dump's fingerprints ({_l(p)}/dump/fingerprints.npy is not a qconsist fingerprint table)"),
    Case("output archive member header lies, manifest rehashed", _lying_npz_member, diff_legacy,
         lambda p: f"run {_l(p)}: outputs/000000.npz member o0.npy: its header says (1099511627776,) float32 (<n> bytes with the header), the file holds <n>; refused"),
    Case("output archive not a zip, manifest rehashed", _not_a_zip, diff_legacy,
         lambda p: f"run {_l(p)}: outputs/000000.npz is not a valid .npz archive (<any>)"),
    Case("output archive holds a pickled object, manifest rehashed", _pickled_output,
         lambda p: ["diff", str(p["legacy"]), str(p["legacy2"]), "--atol", "1"],
         lambda p: f"run {_l(p)}: outputs/000000.npz member o0.npy holds Python objects; refused (qconsist never unpickles)"),
    # the same damage to the files of runs written now: the compact fingerprint table and one file per output
    Case("hash table truncated", lambda p: _truncated_table(p, "inference2", HASHES), diff_inference,
         lambda p: f"run {_i(p)}: dump/table/hashes.npy was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("hash table truncated, manifest rehashed", lambda p: _truncated_table_rehashed(p, "inference2", HASHES), diff_inference,
         lambda p: f"run {_i(p)}: dump/table/hashes.npy: its header says (3, <n>) uint64 (<n> bytes with the header), the file holds <n>; refused"),
    Case("hash table header lies about its shape, manifest rehashed", lambda p: _lying_table(p, "inference2", HASHES, np.dtype("<u8")),
         diff_inference,
         lambda p: f"run {_i(p)}: dump/table/hashes.npy: its header says (1000000, <n>) uint64 (<n> bytes with the header), the file holds <n>; refused"),
    Case("hash table of another dtype, manifest rehashed", lambda p: _wrong_dtype_table(p, "inference2", HASHES), diff_inference,
         lambda p: f"run {_i(p)}: dump/table/hashes.npy: dtype float64 is not the expected uint64; refused"),
    Case("hash table of fewer samples, manifest rehashed", lambda p: _table_file(p, HASHES, lambda a: a[:2]), diff_inference,
         lambda p: f"run {_i(p)}: dump/table/hashes.npy holds (2, <n>), the table (3, <n>); refused"),
    Case("statistics cut short, manifest rehashed", lambda p: _table_file(p, "dump/table/stats.npy", lambda a: a[:-8]), diff_inference,
         lambda p: f"run {_i(p)}: dump/table: starts.npy and stats.npy disagree (damaged)"),
    Case("shape events emptied, manifest rehashed", lambda p: _table_file(p, "dump/table/events.npy", lambda a: a[:0]), diff_inference,
         lambda p: f"run {_i(p)}: dump/table: events.npy lacks the first sample's shapes (damaged)"),
    Case("shape event naming a tensor that is not there, manifest rehashed",
         lambda p: _table_file(p, "dump/table/events.npy", _event_of_no_tensor),
         diff_inference, lambda p: f"run {_i(p)}: dump/table: events.npy does not fit the table (damaged)"),
    Case("output file header lies, manifest rehashed", lambda p: _output_file(p, _lying_output_header), diff_inference,
         lambda p: f"run {_i(p)}: outputs/o0.npy: its header says (1099511627776, 1, 5) float32 (<n> bytes with the header), the file holds <n>; refused"),
    Case("output file holds a pickled object, manifest rehashed", lambda p: _output_file(p, _pickled_output_file),
         lambda p: ["diff", str(p["inference"]), str(p["inference2"]), "--atol", "1"],
         lambda p: f"run {_i(p)}: outputs/o0.npy holds Python objects; refused (qconsist never unpickles)"),
    Case("output file of fewer samples, manifest rehashed", lambda p: _output_file(p, _fewer_output_samples), diff_inference,
         lambda p: f"run {_i(p)}: outputs/o0.npy holds 2 samples, the manifest 3"),
    Case("a sample added after the run", _extra_raw, diff_inference,
         lambda p: "the runs hold 3 and 8 samples; compare runs on the same input set"),
    Case("inference samples not a count", lambda p: edit(p["inference2"], lambda d: d["sections"]["inference"].__setitem__("samples", "3")),
         diff_inference, lambda p: f"run {_i(p)}: the manifest's inference.samples is '3', not a count"),
    Case("artifact path names another file of the run (was: InvalidProtobuf)", _set_artifact_path("quantize/calibration_ranges.json"),
         lambda p: ["run", str(p["pipeline2"]), "--inputs", str(p["data"]), "--runs-dir", str(p["runs"])],
         lambda p: f"run {_q(p)}: quantize/calibration_ranges.json was modified after the run (sha256 {SHA} recorded, {SHA} found)"),
    Case("an output name added to the manifest", lambda p: edit(p["legacy2"], lambda d: d["sections"]["inference"]["outputs"].append("extra")),
         diff_legacy, lambda p: f"run {_l(p)}: outputs/000000.npz has no array 'o1'"),
    Case("an output name added to the manifest (one file per output)",
         lambda p: edit(p["inference2"], lambda d: d["sections"]["inference"]["outputs"].append("extra")),
         diff_inference, lambda p: f"run {_i(p)}: the manifest names 1 output files for 2 outputs (a damaged manifest)"),
    Case("dump index shape table emptied, index rehashed", lambda p: (
            (p["inference2"] / "dump" / "index.json").write_text(json.dumps({**json.loads((p["inference2"] / "dump" / "index.json").read_text()), "shapes": []})),
            rehash(p["inference2"], "dump/index.json")),
         diff_inference, lambda p: f"run {_i(p)}: the fingerprint table names shape <n>, the index has 0"),
    Case("dump index tensors not records, index rehashed", lambda p: (
            (p["inference2"] / "dump" / "index.json").write_text(json.dumps({"tensors": ["x"], "shapes": [[1]]})),
            rehash(p["inference2"], "dump/index.json")),
         diff_inference, lambda p: f"run {_i(p)}: dump/index.json is damaged (tensors and shapes must be lists of records)"),
    Case("ran model path edited to a bait file", lambda p: edit(p["inference2"], lambda d: (d["model"].__setitem__("path", str(p["outside"] / "passwd")),
                                                                                          d["sections"]["dump"].__setitem__("structure", "other"))),
         diff_inference, lambda p: f"run {_i(p)}: the model it ran, {p['outside'] / 'passwd'}, was modified after the run (size <n> recorded, <n> found)"),
]
