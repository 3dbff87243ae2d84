"""Debian's headless Chromium (``make test`` installs it: ``make browser``) for the report tests: a screenshot
of a page, or its DOM after its scripts ran."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

CHROMIUM = "/usr/bin/chromium"


def _chromium(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install -y chromium)")
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", *arguments,
    ]
    return subprocess.run(command, check=True, capture_output=True, timeout=120)


def screenshot(html_file: Path | str, png: Path, tmp_path: Path, size: str = "1280,2000") -> np.ndarray:
    """The page (a file, or a file:// address with a #fragment) as RGB pixels, also saved to ``png``."""
    address = html_file if isinstance(html_file, str) else Path(html_file).resolve().as_uri()
    _chromium(tmp_path, f"--screenshot={png}", f"--window-size={size}", address)
    return np.asarray(Image.open(png).convert("RGB")).astype(np.int16)


def dump_dom(address: str, tmp_path: Path, *arguments: str) -> str:
    """The page's DOM, serialized after its scripts ran (``address``: a file:// address, with a #fragment;
    ``arguments``: more of Chromium's, e.g. ``--allow-file-access-from-files`` for a page that scripts a file it
    frames)."""
    return _chromium(tmp_path, *arguments, "--dump-dom", address).stdout.decode("utf-8")
