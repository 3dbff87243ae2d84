"""The child of ``qconsist calib repeat --isa`` under QEMU: ``python -m qconsist.calibration.isa_worker
REQUEST.json`` calibrates and quantizes once (``qconsist.calibration.isa.calibrate_cell``) and prints what it
ran as one JSON line on stdout."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from qconsist.calibration.isa import calibrate_cell
from qconsist.errors import QconsistError


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    try:
        done = calibrate_cell(json.loads(Path(args[0]).read_text(encoding="utf-8")))
    except QconsistError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    sys.stdout.write(json.dumps(done) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
