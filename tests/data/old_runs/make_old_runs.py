"""Make small real old-layout runs (per-sample outputs/<sample>.npz, 56-byte RECORD fingerprint tables) with the
qconsist checked out where this runs: `python /path/to/this/repo/tests/data/old_runs/make_old_runs.py OUT_DIR PREFIX
[flat]`, from the old checkout. The inputs and models are tests/old_runs.py's ``old_inputs`` (this repository's),
built with the old checkout's tests/onnx_builders.py."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd() / "tests"))  # the old checkout's onnx_builders first
sys.path.append(str(Path(__file__).resolve().parents[2]))  # this repository's tests/old_runs.py
from old_runs import old_inputs
from typer.testing import CliRunner
from qconsist.cli import app

out, prefix = Path(sys.argv[1]), sys.argv[2]
flat = len(sys.argv) > 3 and sys.argv[3] == "flat"  # before class folders (qconsist at 6fe134f)
made = old_inputs(out.parent / ("work-flat" if flat else "work"), flat)
model, variant, images, pipeline = made["model"], made["variant"], made["images"], made["pipeline"]
runner = CliRunner()
for run_id, path, extra in ((f"{prefix}-a", model, ["--raw", "all"]), (f"{prefix}-b", variant, [])):
    args = ["run", str(path), "--inputs", str(images), "--pipeline", str(pipeline), "--dump", *extra,
            "--runs-dir", str(out), "--run-id", run_id]
    result = runner.invoke(app, args)
    print(run_id, result.exit_code, result.stdout[-400:], result.stderr[-400:] if result.stderr_bytes else "")
