"""Real photographs shipped inside installed packages (scikit-image and scikit-learn: ``qconsist[photos]``).

``package:photos`` in a pipeline file names this list, in this fixed order. Only photographs of real
scenes are listed: synthetic images (chessboards, logos, text, phantoms) are left out. The packages are read
as folders of files, never imported. They are an extra, not a dependency: six of the photographs carry no
licence that would let qconsist ship them itself (``moon``, ``page``, the Middlebury ``motorcycle`` pair, and
``ihc`` and ``coins`` with "no known copyright restrictions"; docs/install.md, "Set-up").
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from qconsist.errors import InputError

# (package, path inside the package); colour photographs first, then grey ones.
PHOTOS: tuple[tuple[str, str], ...] = (
    ("skimage", "data/astronaut.png"),
    ("skimage", "data/chelsea.png"),
    ("skimage", "data/coffee.png"),
    ("skimage", "data/rocket.jpg"),
    ("sklearn", "datasets/images/china.jpg"),
    ("sklearn", "datasets/images/flower.jpg"),
    ("skimage", "data/motorcycle_left.png"),
    ("skimage", "data/motorcycle_right.png"),
    ("skimage", "data/hubble_deep_field.jpg"),
    ("skimage", "data/ihc.png"),
    ("skimage", "data/retina.jpg"),
    ("skimage", "data/camera.png"),
    ("skimage", "data/coins.png"),
    ("skimage", "data/moon.png"),
    ("skimage", "data/grass.png"),
    ("skimage", "data/gravel.png"),
    ("skimage", "data/brick.png"),
    ("skimage", "data/cell.png"),
    ("skimage", "data/clock_motion.png"),
    ("skimage", "data/microaneurysms.png"),
    ("skimage", "data/page.png"),
)


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise InputError(f"package:photos needs the '{package}' package: pip install 'qconsist[photos]'")
    return Path(spec.origin).parent


def package_photos() -> list[Path]:
    """Paths of the bundled photographs that exist in the installed package versions, in fixed order."""
    found = []
    for package, relative in PHOTOS:
        path = _package_dir(package) / relative
        if path.is_file():
            found.append(path)
    if not found:
        raise InputError("no bundled photographs found in scikit-image / scikit-learn")
    return found
