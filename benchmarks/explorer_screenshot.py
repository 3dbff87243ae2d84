"""Render a diff's per-node divergence in Google Model Explorer, headless, into a PNG (run by hand).

    python benchmarks/explorer_screenshot.py RUN_A RUN_B OUT.png [--measure status] [--port 8097]

Writes the overlay (qconsist.explain.explorer), starts Model Explorer's server on 127.0.0.1 with the model and
the node data, takes a screenshot with Debian's chromium (headless, loopback only), stops the server. The
layers are flattened and the first diverging node selected through Model Explorer's URL state.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from qconsist.diff import diff_runs
from qconsist.explain.explorer import explorer_overlay


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("png", type=Path)
    parser.add_argument("--measure", default="status")
    parser.add_argument("--port", type=int, default=8097)
    parser.add_argument("--seconds", type=int, default=240)
    args = parser.parse_args()
    diff = diff_runs(args.run_a, args.run_b)
    overlay = explorer_overlay(diff)
    folder = Path(tempfile.mkdtemp(prefix="qconsist-explorer-"))
    overlay.write(folder)
    data = folder / f"{args.measure}.json"
    server = subprocess.Popen([str(Path(sys.executable).parent / "model-explorer"), "--extensions", "model_explorer_onnx",
                               "--no_open_in_browser", "--host", "127.0.0.1", "--port", str(args.port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{args.port}/"
        for _ in range(60):
            try:
                urllib.request.urlopen(base, timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        first = diff.tensors.first.label if diff.tensors is not None and diff.tensors.first is not None else ""
        state = {"models": [{"url": str(overlay.model)}], "nodeData": [str(data)], "nodeDataTargets": [""],
                 "uiState": {"paneStates": [{"deepestExpandedGroupNodeIds": [], "selectedNodeId": first,
                                             "selectedGraphId": overlay.graph_id, "selectedCollectionLabel": "",
                                             "widthFraction": 1, "flattenLayers": True}]}}
        url = base + "?data=" + urllib.parse.quote(json.dumps(state))
        subprocess.run(["/usr/bin/chromium", "--headless=new", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--no-first-run",
                        "--disable-background-networking", "--window-size=1400,900", "--virtual-time-budget=20000",
                        f"--screenshot={args.png}", url], timeout=args.seconds, capture_output=True)
    finally:
        server.terminate()
        server.wait(10)
    print(f"{args.png}: {overlay.nodes} nodes of {overlay.model} ({args.measure})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
