"""Helpers live below their users: no import runs back up a layer, and imports are at the top of modules
except where the package says why (the CLI's lazy command imports, numba's kernels)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "qconsist"

# bottom to top; a module may import its own layer and the ones below it
LAYERS = [
    {"errors", "limits", "progress", "tomlfile", "environment", "threads", "onnxfile", "discovery", "front", "__init__", "cpu",
     "emulation", "interrupt"},
    {"store", "models"},
    {"inputs"},
    {"compare"},
    {"inference"},
    {"stages"},
    {"calibration"},
    {"pipeline"},
    {"diff", "inspect"},
    {"explain"},
    {"upgrade"},
    {"locate"},
    {"gate"},
    {"sensitivity"},
    {"history", "report"},
    {"nightly"},
    {"api", "cli", "__main__"},
]
RANK = {area: rank for rank, layer in enumerate(LAYERS) for area in layer}
# inference/kernels.py: numba (1–3 s to import) is loaded on the first fingerprint, not by every command;
# api.py: the top-level calls load the library when first made, so that `import qconsist` (the CLI's first
# import) stays light; __main__.py: the command line is imported inside the guard that makes an early Ctrl-C one line
LAZY_ALLOWED = ("cli/", "inference/kernels.py", "api.py", "__main__.py")


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        module = ".".join(("qconsist", *relative.with_suffix("").parts))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inner = {id(sub) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for sub in ast.walk(fn) if isinstance(sub, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "qconsist" or name.startswith("qconsist."):
                    yield str(relative), module, name, id(node) in inner


def test_every_area_has_a_layer():
    areas = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert areas <= set(RANK), sorted(areas - set(RANK))


def test_no_import_runs_back_up_a_layer():
    upward = [(module, target) for _, module, target, _ in _imports() if RANK[_area(target)] > RANK[_area(module)]]
    assert upward == []


def test_imports_are_at_the_top_except_where_the_package_says_why():
    hidden = sorted({(path, target) for path, _, target, inner in _imports()
                     if inner and not path.startswith(LAZY_ALLOWED)})
    assert hidden == []
