"""Start-up of a short `qconsist run`, side by side: this checkout against another (e.g. an older commit,
unpacked with `git archive COMMIT | tar -x -C DIR`), alternating, median of N.

    python benchmarks/startup.py RUN_DIR --before DIR [--inputs package:photos:augmented:32] [--repeats 7]
        [--run-args "--pipeline pipelines/open_nsfw.toml --ep cuda --batch-size 32 --count 1 --dynamic-batch"]
        [--no-uncached]

For each side: the wall time of the whole command, its CPU time, the import time of all modules
(`python -X importtime`, summed over the top-level imports), whether numba was imported, and the start-up that
`qconsist -v run` logs ("start-up: X s from ... to the first step": from the process's start where the side logs
it so, else from run_inference's start, which leaves the listing of the inputs out). The last round's start-up
line of this side is printed whole (its phases). Bytecode caches are written and used (a normal install); a shell
with PYTHONDONTWRITEBYTECODE=1 compiles every module at every start, which the second table shows
(``--no-uncached``: left out).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CODE = ("import sys; from qconsist.cli import main; sys.argv = ['qconsist'] + sys.argv[1:]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('numba imported: %s\\n' % ('numba' in sys.modules))")
STARTUP = re.compile(r"qconsist\.inference\.runner: start-up: ([0-9.]+) s from (.*)$")


def _once(checkout: Path, args: list[str], bytecode: bool) -> tuple[float, float, float, bool, float, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    with tempfile.TemporaryDirectory(prefix="qconsist-startup-") as runs:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", CODE, "-v", *args, "--runs-dir", runs],
                              env=env, capture_output=True, text=True, cwd=runs)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "numba imported" not in done.stderr or "internal error" in done.stderr or "\nerror: " in done.stderr:
        raise SystemExit(f"the run failed: {done.stderr[-2000:]}")
    imports = sum(int(line.split("|")[1]) for line in done.stderr.splitlines()
                  if line.startswith("import time:") and "|" in line and not line.split("|")[2].startswith("  ")
                  and line.split("|")[1].strip().isdigit())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = [STARTUP.search(line) for line in done.stderr.splitlines()]
    line = next((m for m in found if m), None)
    return (wall, cpu, imports / 1e6, "numba imported: True" in done.stderr, float(line.group(1)) if line else float("nan"),
            line.group(0).split("runner: ", 1)[1] if line else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an .onnx model or a run directory (its quantize artifact)")
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its folder holds qconsist/)")
    parser.add_argument("--inputs", default="package:photos:augmented:32")
    parser.add_argument("--run-args", default="", help="more options of `qconsist run`, as one string")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-uncached", action="store_true", help="leave out the PYTHONDONTWRITEBYTECODE=1 table")
    options = parser.parse_args()
    args = ["run", str(Path(options.model).resolve()), "--inputs", options.inputs, *shlex.split(options.run_args)]
    sides = {"before": options.before.resolve(), "after": HERE}
    for bytecode in (True,) if options.no_uncached else (True, False):
        results: dict[str, list] = {name: [] for name in sides}
        for name, checkout in sides.items():  # once each to write the bytecode caches
            _once(checkout, args, bytecode)
        for _ in range(options.repeats):
            for name, checkout in sides.items():
                results[name].append(_once(checkout, args, bytecode))
        print(f"\n`qconsist run … --inputs {options.inputs} {options.run_args}`, "
              f"{'bytecode cached' if bytecode else 'PYTHONDONTWRITEBYTECODE=1'}, median of {options.repeats} (alternating)")
        print("| side | wall s | CPU s | imports s | numba imported | start-up s (-v) | walls s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, rows in results.items():
            wall, cpu, imports, _, startup = (statistics.median(r[i] for r in rows) for i in (0, 1, 2, 3, 4))
            walls = " ".join(f"{r[0]:.2f}" for r in rows)
            print(f"| {name} | {wall:.2f} | {cpu:.2f} | {imports:.2f} | {rows[0][3]} | {startup:.2f} | {walls} |")
        ratio = statistics.median(r[0] for r in results["after"]) / statistics.median(r[0] for r in results["before"])
        paired = [a[0] / b[0] for a, b in zip(results["after"], results["before"])]
        print(f"after / before wall: {ratio:.2f} (paired rounds: {' '.join(f'{p:.2f}' for p in paired)})")
        for name, rows in results.items():
            print(f"{name}'s start-up line: {rows[-1][5]}")


if __name__ == "__main__":
    main()
