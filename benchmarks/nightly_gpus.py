"""A night across the GPUs of one machine (``--executor ray``) against the same entries one after another on one
GPU (``--executor local`` with ``CUDA_VISIBLE_DEVICES`` set to the first GPU), side by side in one run, as a ratio.

    python3 benchmarks/nightly_gpus.py [pipelines/nightly.toml] [--small] [--only NAME ...] [--out DIR] [--json]
        [--night both|one|two]

Each night is its own ``qconsist nightly --json`` process in a fresh runs folder (first night: no baseline), the
one-GPU night first. The figures are the nights' own records: the night's wall time (``seconds`` of its summary:
from the first task handed out to the last outcome; the Ray night's includes starting the local Ray) and each
entry's time, plus the process's wall time. The ratio is two GPUs / one GPU (below 1: the two GPUs are faster).
It also says on which GPU (host index and UUID) each entry ran, and whether both nights gave the same verdicts,
stage md5s and figures (they must: the executor changes where an entry runs, not what it computes).

``--night one`` runs the one-GPU night alone and keeps its record in ``--out`` (``night-local.json``); ``--night two``
then runs the two-GPU night and compares it with that record (for a machine that limits one command's time: the two
nights as two commands, one after the other on the same machine, the same ``--out``).

``--small``: the nightly file's entries with the test suite's small counts (tests/nightly_files.py: 3
calibration photographs, 2 evaluation photographs), for a run of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def host_gpus() -> list[str]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False).stdout
    return [line.strip() for line in out.strip().splitlines() if line.strip()]


def night(config: Path, executor: str, runs: Path, only: list[str], env: dict[str, str], log: Path) -> tuple[dict, float, int]:
    command = [sys.executable, "-c", "from qconsist.cli import main; main()", "nightly", str(config), "--executor", executor,
               "--runs-dir", str(runs), "--json", *[a for name in only for a in ("--only", name)]]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    log.write_text(done.stderr)
    try:
        return json.loads(done.stdout), seconds, done.returncode
    except ValueError:
        raise SystemExit(f"{executor} night printed no JSON (exit {done.returncode}); its log: {log}\n{done.stderr[-2000:]}") from None


def _stages(entry: dict, runs: Path) -> list:
    """The pipeline's stage md5s of an entry, from its pipeline run's manifest (or as its record kept them)."""
    if "stage_md5s" in entry:
        return [tuple(s) for s in entry["stage_md5s"]]
    if not entry.get("pipeline_run"):
        return []
    if not (Path(entry["pipeline_run"]) / "manifest.json").is_file():
        return None
    manifest = json.loads((Path(entry["pipeline_run"]) / "manifest.json").read_text())
    return [(s.get("name"), (s.get("artifact") or {}).get("md5")) for s in manifest.get("stages") or []]


def _pairs(one: dict, two: dict) -> list[tuple[dict, dict]]:
    """The two nights' records of each model both ran (a kept one-GPU night may hold more: ``--only``)."""
    second = {e["model"]: e for e in two["raw"]["entries"]}
    return [(e, second[e["model"]]) for e in one["raw"]["entries"] if e["model"] in second]


def _verdict(entry: dict) -> list:
    verdict = entry.get("verdict") or {}
    return [(c.get("name"), c.get("status")) for c in verdict.get("checks") or []]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nightly", nargs="?", default=str(ROOT / "pipelines" / "nightly.toml"))
    parser.add_argument("--small", action="store_true", help="the test suite's small counts")
    parser.add_argument("--only", nargs="*", default=[], help="these entries only (with --small: in the file's order)")
    parser.add_argument("--out", default=None, help="keep the runs, JSON and logs here (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--night", choices=("both", "one", "two"), default="both",
                        help="one: the one-GPU night alone, kept in --out; two: the two-GPU night against that record")
    args = parser.parse_args()

    gpus = host_gpus()
    if len(gpus) < 2:
        raise SystemExit(f"needs a machine with two GPUs; nvidia-smi lists {len(gpus)}")
    folder = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="nightly-gpus-"))
    folder.mkdir(parents=True, exist_ok=True)
    config = Path(args.nightly).resolve()
    if args.small:
        from nightly_files import derived_nightly

        config = derived_nightly(folder, args.only or None)
    base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    first = gpus[0].split(",")[0].strip()
    results = {}
    nights = (("one GPU", "local", {**base, "CUDA_VISIBLE_DEVICES": first}), ("two GPUs", "ray", base))
    if args.night == "two":
        kept = folder / "night-local.json"
        if not kept.is_file():
            raise SystemExit(f"--night two compares with the one-GPU night's record {kept}: run --night one first")
        results["one GPU"] = json.loads(kept.read_text())
    for label, executor, env in nights[1 if args.night == "two" else 0:1 if args.night == "one" else 2]:
        data, wall, code = night(config, executor, folder / f"runs-{executor}", args.only, env, folder / f"{executor}.log")
        results[label] = {"executor": executor, "exit": code, "process_seconds": round(wall, 2),
                          "night_seconds": data.get("seconds"), "summary": data.get("summary"),
                          "entries": [{"model": e["model"], "status": e["status"], "seconds": e["seconds"],
                                       "gpus": [f"GPU {d['host_index']} {d['uuid']}" for d in e.get("devices") or []],
                                       "error": e.get("error")} for e in data["entries"]],
                          "raw": data}
        for entry in data["entries"]:  # kept with the record: a later command may no longer have the runs
            entry["stage_md5s"] = _stages(entry, folder)
        (folder / f"night-{executor}.json").write_text(json.dumps(results[label]))
        print(f"{label} ({executor}): exit {code}, night {data.get('seconds') or 0:.1f} s, process {wall:.1f} s, "
              f"entries {[(e['model'], round(e['seconds'], 1)) for e in data['entries']]}", file=sys.stderr, flush=True)
    if args.night == "one":
        return
    one, two = results["one GPU"], results["two GPUs"]
    same = {}
    for a, b in _pairs(one, two):
        same[a["model"]] = {"status": a["status"] == b["status"], "verdict": _verdict(a) == _verdict(b),
                            # a record kept without its md5s whose runs are gone: none to compare
                            "md5s": (bool(_stages(a, folder)) and _stages(a, folder) == _stages(b, folder))
                            if _stages(a, folder) is not None else None,
                            # accuracy figures: an entry without classes (the FCN head) records none on either night
                            "figures": (a.get("figures") == b.get("figures")) if a.get("figures") or b.get("figures") else None}
    report = {
        "gpus": gpus, "config": str(config),
        "nights": {k: {kk: vv for kk, vv in v.items() if kk != "raw"} for k, v in results.items()},
        # the ratio only where both nights ran the same entries
        "ratio_night": round(two["night_seconds"] / one["night_seconds"], 3)
        if one["night_seconds"] and len(_pairs(one, two)) == len(one["raw"]["entries"]) else None,
        "ratio_process": round(two["process_seconds"] / one["process_seconds"], 3)
        if len(_pairs(one, two)) == len(one["raw"]["entries"]) else None,
        "entries_sum_one_gpu": round(sum(e["seconds"] for e in one["entries"]), 2),
        "same": same,
    }
    (folder / "nightly_gpus.json").write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print("GPUs:", "; ".join(gpus))
    for label, night_data in report["nights"].items():
        print(f"{label} ({night_data['executor']}): exit {night_data['exit']}, night {night_data['night_seconds']:.1f} s, "
              f"process {night_data['process_seconds']:.1f} s, {night_data['summary']}")
        for e in night_data["entries"]:
            print(f"  {e['status']:5} {e['model']:26} {e['seconds']:7.1f} s  {', '.join(e['gpus']) or 'no GPU'}"
                  + (f"  error: {e['error']}" if e["error"] else ""))
    print(f"ratio two GPUs / one GPU: night {report['ratio_night']}, process {report['ratio_process']} "
          f"(sum of the entries on one GPU: {report['entries_sum_one_gpu']} s)")
    for model, checks in same.items():
        print(f"  {model}: " + ", ".join(f"{k} {'none recorded' if v is None else 'same' if v else 'DIFFERENT'}"
                                          for k, v in checks.items()))
    # where the verdicts differ, each night's checks that did not pass, with their messages
    for a, b in _pairs(one, two):
        if _verdict(a) != _verdict(b):
            for label, entry in (("one GPU", a), ("two GPUs", b)):
                for check in (entry.get("verdict") or {}).get("checks") or []:
                    if check.get("status") not in ("pass", "not_applicable"):
                        print(f"  {entry['model']} on {label}: {check.get('name')} {check.get('status')}: {check.get('message')}")


if __name__ == "__main__":
    main()
