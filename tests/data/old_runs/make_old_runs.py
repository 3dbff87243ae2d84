"""Make small real old-layout runs (per-sample outputs/<sample>.npz, 56-byte RECORD fingerprint tables) with the
qconsist checked out where this runs: `python make_old_runs.py OUT_DIR PREFIX`."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd() / "tests"))
import numpy as np
from PIL import Image
from onnx_builders import build_classifier_model
from typer.testing import CliRunner
from qconsist.cli import app

out, prefix = Path(sys.argv[1]), sys.argv[2]
flat = len(sys.argv) > 3 and sys.argv[3] == "flat"  # before class folders (qconsist at 6fe134f)
work = out.parent / ("work-flat" if flat else "work")
work.mkdir(parents=True, exist_ok=True)
model = build_classifier_model(work / "classifier.onnx")
variant = build_classifier_model(work / "variant.onnx", fc_bias=[0.3, 0.0, 0.0, 0.0, 0.0])
images = work / "images"
rng = np.random.default_rng(5)
for i in range(8):
    folder = images if flat else images / f"class{i % 5}"
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
pipeline = work / "tiny.toml"
pipeline.write_text(f'name = "tiny"\n[model]\nonnx = "{model}"\n[calibration]\ndata = "{images}"\n'
                    '[preprocess]\nresize = [8, 8]\npixel_range = 1.0\n')
runner = CliRunner()
for run_id, path, extra in ((f"{prefix}-a", model, ["--raw", "all"]), (f"{prefix}-b", variant, [])):
    args = ["run", str(path), "--inputs", str(images), "--pipeline", str(pipeline), "--dump", *extra,
            "--runs-dir", str(out), "--run-id", run_id]
    result = runner.invoke(app, args)
    print(run_id, result.exit_code, result.stdout[-400:], result.stderr[-400:] if result.stderr_bytes else "")
