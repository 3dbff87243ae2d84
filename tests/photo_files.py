"""Image folders built from the bundled photographs, as users keep datasets: flat, or one folder per class."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from qconsist.inputs.photos import package_photos


def photo(path: Path, index: int, size: tuple[int, int] = (40, 30)) -> Path:
    """Bundled photograph ``index`` (mod their count), shrunk, saved at ``path`` (its suffix picks the format)."""
    photos = package_photos()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.open(photos[index % len(photos)]).convert("RGB").resize(size).save(path)
    return path


def class_tree(root: Path, classes: dict[str, int]) -> Path:
    """``root/<class>/<n>.jpg``, ``classes[class]`` photographs each (a different photograph per file)."""
    index = 0
    for name, count in classes.items():
        for n in range(count):
            photo(root / name / f"{n:03d}.jpg", index)
            index += 1
    return root
