"""The typer application, the error boundary and the terminal helpers shared by every command."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import typer
from rich.console import Console

from qconsist import __version__
from qconsist.errors import QconsistError

app = typer.Typer(
    name="qconsist",
    help="Are your quantized ONNX models reproducible? If not, which node is to blame?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

F = TypeVar("F", bound=Callable[..., Any])


def stdout_console() -> Console:
    # markup off: tensor and node names may contain "[...]", which rich would otherwise eat; style with Text.
    return Console(highlight=False, soft_wrap=False, markup=False)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def fail(message: str, code: int) -> None:
    """Print ``error: message`` on one line to stderr and exit with ``code``."""
    text = " ".join(str(message).split())
    sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def handles_errors(func: F) -> F:
    """Decorator for commands: a ``QconsistError`` becomes one line on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except QconsistError as exc:
            fail(exc.message, exc.exit_code)
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted\n")
            raise typer.Exit(130)

    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, allow_nan=False, default=str) + "\n")


def show_progress(json_output: bool) -> bool:
    """Progress bars only on an interactive terminal, never under --json or in CI."""
    return not json_output and sys.stderr.isatty() and not os.environ.get("CI")


class RichProgress:
    """``qconsist.progress.Progress`` drawn with rich on stderr."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=stderr_console(), transient=True,
        )

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Any]:
        task_id = self._progress.add_task(description, total=total)
        progress = self._progress

        class Handle:
            def advance(self, amount: int = 1) -> None:
                progress.advance(task_id, amount)

        with progress:
            try:
                yield Handle()
            finally:
                progress.remove_task(task_id)


def progress_for(json_output: bool):  # -> Progress
    from qconsist.progress import NULL_PROGRESS

    return RichProgress() if show_progress(json_output) else NULL_PROGRESS


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"qconsist {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the library does (to stderr)."),
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version."),
) -> None:
    """Are your quantized ONNX models reproducible? If not, which node is to blame?"""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
