"""The child of ``qconsist locate --ep cpu`` under QEMU: ``python -m qconsist.locate.isa_worker REQUEST.json``
runs every cell of the request (``qconsist.locate.isa.run_cells``) and prints their run directories as one
JSON line on stdout."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from qconsist.errors import QconsistError
from qconsist.locate.isa import run_cells


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    try:
        done = run_cells(json.loads(Path(args[0]).read_text(encoding="utf-8")))
    except QconsistError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    sys.stdout.write(json.dumps(done) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
