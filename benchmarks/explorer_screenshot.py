"""Render a diff's per-node divergence in Google Model Explorer, headless, into a PNG (run by hand).

    python benchmarks/explorer_screenshot.py RUN_A RUN_B OUT.png [--measure status] [--port 8097]

Writes the overlay (qconsist.report.explorer), starts Model Explorer's server on 127.0.0.1 with the model and
the node data, takes a screenshot with Debian's chromium (headless, loopback only, driven through its DevTools pipe once the
graph is drawn), stops the server. The
layers are flattened and the first diverging node selected through Model Explorer's URL state.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from qconsist.diff import diff_runs
from qconsist.report.explorer import explorer_overlay


class _DevTools:
    """Chromium's DevTools protocol over --remote-debugging-pipe (file descriptors 3 and 4 of the child;
    messages are JSON separated by NUL), so no websocket library is needed."""

    def __init__(self, url: str) -> None:
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()

        def fds() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes the replies
            os.dup2(to_chrome, 3)
            os.dup2(from_chrome, 4)

        self.process = subprocess.Popen(
            ["/usr/bin/chromium", "--headless=new", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
             "--no-first-run", "--disable-background-networking", "--window-size=1400,900", "--remote-debugging-pipe", url],
            close_fds=False, preexec_fn=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer = b""
        self._id = 0
        self.session: str | None = None

    def call(self, method: str, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def _screenshot(url: str, png: Path, seconds: int) -> None:
    """Open ``url``, wait until Model Explorer has converted the model and drawn the graph, save a PNG."""
    chrome = _DevTools(url)
    try:
        page = next(t for t in chrome.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        chrome.session = chrome.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        deadline = time.monotonic() + seconds
        ready = "!!document.querySelector('canvas') && !document.body.innerText.includes('Converting')"
        while time.monotonic() < deadline:
            if chrome.call("Runtime.evaluate", expression=ready, returnByValue=True)["result"].get("value"):
                break
            time.sleep(1)
        else:
            raise RuntimeError(f"Model Explorer did not show the graph within {seconds} s")
        time.sleep(5)  # the graph's layout and the node data's colours settle
        shot = chrome.call("Page.captureScreenshot", format="png")
        png.write_bytes(base64.b64decode(shot["data"]))
    finally:
        chrome.close()


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
        _screenshot(url, args.png, args.seconds)
    finally:
        server.terminate()
        server.wait(10)
    print(f"{args.png}: {overlay.nodes} nodes of {overlay.model} ({args.measure})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
