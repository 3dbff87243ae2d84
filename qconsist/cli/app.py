"""The typer application: one error boundary, ``-v``/``-q`` anywhere, old spellings of options as hidden
aliases, and the terminal helpers every command shares.

The boundary (``QconsistGroup.invoke``) maps what a command raises to one line on stderr and an exit code:
a ``QconsistError`` to its own code (its message with the command's flags for the parameters it names),
Ctrl-C to 130, a write that failed for want of space (``OSError`` ENOSPC/EDQUOT/EFBIG) to 2, anything else to
``internal error: …`` and 4 — never the code of a failed gate — with the traceback under ``-v``.

The boundary also captures onnxruntime's own log (its C++ logger writes to descriptor 2) for the whole
command, so none of it lands between qconsist's lines: what a run directory keeps (its ``onnxruntime.log``) the
command notes itself; anything else is summarized here in one line, ``note: onnxruntime logged …``, after the
command's output (not after an error, whose line stays the only one; not under ``-q``; with ``-v`` always, and
the lines themselves are logged).
"""

from __future__ import annotations

import errno
import signal
import threading
import logging
import os
import sys
import traceback
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from qconsist import interrupt
from qconsist.errors import EXIT_DIVERGED, EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED, QconsistError
from qconsist.limits import NAME_MAX, long_component, shorten
from qconsist.store.ortlog import capture_ort_log
from qconsist.store.rundir import NO_SPACE

VERBOSE = ("-v", "--verbose")
QUIET = ("-q", "--quiet")

# Spellings of earlier versions, still accepted (hidden from --help): command path -> old -> current.
ALIASES: dict[tuple[str, ...], dict[str, str]] = {
    ("calib", "repeat"): {"--data": "--inputs", "--provider": "--ep", "--runs": "--repeats", "-n": "--repeats"},
    ("locate",): {"--fp16-ep": "--ep", "--search": "--cudnn-conv-algo-search", "--runs": "--timed-runs", "-k": "--repeats"},
    ("history",): {"--db": "--history"},
}


def _command_path(group: Any, args: list[str]) -> tuple[tuple[str, ...], Any]:
    """The subcommand names at the front of ``args`` (``calib repeat``) and the command they name."""
    path: list[str] = []
    command: Any = group
    for arg in args:
        commands = getattr(command, "commands", None)
        if arg.startswith("-") or not isinstance(commands, dict) or arg not in commands:
            break
        path.append(arg)
        command = commands[arg]
    return tuple(path), command


def _is_cli_exception(exc: BaseException) -> bool:
    """click's and typer's own exceptions (usage errors, --help's exit): theirs to handle."""
    return type(exc).__module__.split(".")[0] in ("click", "typer")


class QconsistGroup(TyperGroup):
    """The root command group (see the module docstring)."""

    verbosity = 0
    arguments: list[str] = []

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        rest, level = [], 0
        for index, arg in enumerate(args):
            if arg == "--":
                rest += args[index:]
                break
            if arg in VERBOSE:
                level = 1
            elif arg in QUIET:
                level = -1
            else:
                rest.append(arg)
        path, command = _command_path(self, rest)
        aliases = ALIASES.get(path, {})
        rest = [_alias(arg, aliases) for arg in rest]
        QconsistGroup.verbosity = level
        ctx.meta["qconsist.command"] = command
        QconsistGroup.arguments = list(rest)  # the arguments as given: --isa gives them to a child under QEMU
        logging.basicConfig(
            level={1: logging.INFO, 0: logging.WARNING, -1: logging.ERROR}[level],
            format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True,
        )
        return super().parse_args(ctx, rest)

    def invoke(self, ctx: Any) -> Any:
        _bytes_of_paths()
        with _terminate_as_interrupt(), _onnxruntime_log():
            return self._invoke(ctx)

    def _invoke(self, ctx: Any) -> Any:
        try:
            return _interruptible(super().invoke, ctx)
        except QconsistError as exc:
            _fail(exc.render(_flag_namer(ctx.meta.get("qconsist.command"))), exc.exit_code)
        except KeyboardInterrupt:
            interrupt.say()
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:  # a path given with a component over 255 bytes: bad input
                long = long_component(exc.filename or "") if isinstance(exc.filename, (str, bytes, os.PathLike)) else None
                what = f"{shorten(os.fsdecode(long), 40)!r} is {len(os.fsencode(long))} bytes long" if long else "a name is too long"
                _fail(f"cannot use the path {shorten(os.fsdecode(exc.filename or ''))}: {what}; a file name has at most "
                      f"{NAME_MAX}", EXIT_ERROR)
            if exc.errno not in NO_SPACE:
                _internal(exc)
            if QconsistGroup.verbosity > 0:
                traceback.print_exception(exc, file=sys.stderr)
            reason = exc.strerror or os.strerror(exc.errno)
            _fail(f"cannot write {exc.filename}: {reason}" if exc.filename else f"a write failed: {reason}", EXIT_ERROR)
        except Exception as exc:  # noqa: BLE001 - the boundary: anything else is a bug, said in one line
            if _is_cli_exception(exc):
                if type(exc).__name__ != "NoArgsIsHelpError" and getattr(exc, "exit_code", None) == 2 and hasattr(exc, "format_message"):
                    _fail(exc.format_message(), 2)  # a usage error: one line too, not click's three
                raise
            _internal(exc)


def _interruptible(invoke: Any, ctx: Any) -> Any:
    """``invoke(ctx)``; an error raised after a Ctrl-C or SIGTERM came (an extension that turned the interrupt
    into an ``ImportError``, a cleanup that failed on the way out) is the interrupt's: 130, not its own line."""
    try:
        return invoke(ctx)
    except Exception as exc:
        if interrupt.received() and not _is_cli_exception(exc):
            raise interrupt.Interrupted() from exc
        raise


def _internal(exc: BaseException) -> None:
    """A bug: one line, exit 4 (the traceback under -v)."""
    if QconsistGroup.verbosity > 0:
        traceback.print_exception(exc, file=sys.stderr)
    where = traceback.extract_tb(exc.__traceback__)[-1]
    detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    _fail(f"{detail} (at {os.path.basename(where.filename)}:{where.lineno}) — rerun with -v for the traceback",
          EXIT_INTERNAL, prefix="internal error")


_notes: list[Any] | None = None  # the run directories' logs a command noted, said by the boundary in one line


@contextmanager
def _onnxruntime_log() -> Iterator[None]:
    """onnxruntime's log of the whole command captured (see the module docstring): it and the logs the command's
    run directories kept are noted in one line after the command."""
    global _notes
    completed = False
    _notes = []
    with ExitStack() as stack:
        record = stack.enter_context(capture_ort_log(None))
        try:
            yield
            completed = True
        except typer.Exit as done:
            completed = done.exit_code in (0, EXIT_DIVERGED)
            raise
        finally:
            stack.close()  # the capture ends before anything is said about it
            kept, _notes = _notes, None
            if QconsistGroup.verbosity >= 0 and (completed or QconsistGroup.verbosity > 0):
                if record.lines:
                    logging.getLogger("qconsist.onnxruntime").info("onnxruntime's log:\n%s", record.text.rstrip())
                line = combined_summary([*kept, record])
                if line:
                    stderr_console().print(f"note: {line}")


def combined_summary(logs: list[Any]) -> str | None:
    """One line for onnxruntime's log of a command: what the run directories kept (``OrtLog`` with a path) and
    what was captured outside them (not kept)."""
    logs = [entry for entry in logs if entry.lines]
    if not logs:
        return None
    kept = [entry for entry in logs if entry.path]
    loose = sum(entry.lines for entry in logs if not entry.path)
    warnings, errors = sum(e.warnings for e in logs), sum(e.errors for e in logs)
    counts = f"{warnings} warning(s), {errors} error(s)" if warnings or errors else f"{sum(e.lines for e in logs)} line(s)"
    where = f" to {', '.join(e.path for e in kept)}" if kept else ""
    if kept and loose:
        where += f" ({loose} line(s) outside the run, not kept)"
    first = next((e.first for e in logs if e.first), None)
    return f"onnxruntime logged {counts}{where}" + (f"; first: {first}" if first else "")


def _bytes_of_paths() -> None:
    """A file name that is not UTF-8 is printed as the bytes it is (Python holds them as surrogate escapes),
    as ``ls`` prints it, instead of failing to encode; on a stream of another encoding what it cannot hold is
    written as a backslash escape."""
    for stream in (sys.stdout, sys.stderr):
        if not hasattr(stream, "reconfigure"):
            continue
        if getattr(stream, "encoding", "").lower().replace("-", "") == "utf8":
            stream.reconfigure(errors="surrogateescape")
        else:  # PYTHONIOENCODING=ascii, a latin-1 terminal: "→" is written as \u2192, never a UnicodeEncodeError
            stream.reconfigure(errors="backslashreplace")


Terminated = interrupt.Terminated


TERMINATE_GRACE = 2.0  # seconds the main thread has to take up a SIGTERM before the process ends at once


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raised as ``Terminated`` in the main thread; and, since the main thread takes up a signal only
    between Python instructions (not while onnxruntime runs a batch for minutes), a watchdog woken by the signal
    itself (``signal.set_wakeup_fd``) that, ``TERMINATE_GRACE`` seconds later, removes the open scratch folders,
    says ``error: interrupted`` and ends the process with 130 — what a SIGKILL leaves, an incomplete run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = signal.signal(signal.SIGTERM, interrupt.handler)  # as the command's own (qconsist.interrupt)
    read, write = os.pipe()
    os.set_blocking(write, False)
    done = threading.Event()
    try:
        previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # pragma: no cover - not the main thread of the main interpreter
        previous_fd = None
    watchdog = threading.Thread(target=_watch_for_terminate, args=(read, done), daemon=True, name="qconsist-sigterm")
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        if previous_fd is not None:
            signal.set_wakeup_fd(previous_fd)
        os.close(write)  # wakes the watchdog, which closes ``read``
        signal.signal(signal.SIGTERM, previous)


def _watch_for_terminate(read: int, done: threading.Event) -> None:
    try:
        while not done.is_set():
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data and not done.wait(TERMINATE_GRACE):
                from qconsist.store.scratch import remove_live

                remove_live()
                interrupt.say()  # on the terminal's stderr (descriptor 2 is onnxruntime's log)
                os._exit(EXIT_INTERRUPTED)
    finally:
        os.close(read)


def _alias(arg: str, aliases: dict[str, str]) -> str:
    if not arg.startswith("-"):
        return arg
    flag, sep, value = arg.partition("=")
    return aliases.get(flag, flag) + sep + value


def _flag_namer(command: Any):
    """Spell a parameter as the flag of the command that ran (``count`` -> ``--count``)."""
    flags: dict[str, str] = {}
    for param in getattr(command, "params", []):
        long = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        if getattr(param, "param_type_name", "") == "option" and long:
            flags[param.name] = long[0]
    return lambda name: flags.get(name, name)


def _fail(message: str, code: int, prefix: str = "error") -> None:
    text = " ".join(str(message).split())
    sys.stderr.write(f"{prefix}: {text}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


class PanelCommand(TyperCommand):
    """A command whose ``--help`` shows its options in panels, as Polygraphy groups its arguments: the command's
    own options first, then each panel its options name (``rich_help_panel``: Model, Inputs, Execution, Output),
    in plain text (rich's boxes would read markup in node and tensor names)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        from qconsist.cli.options import PANELS

        arguments: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for name in ("Options", *PANELS, *sorted(set(panels) - {"Options", *PANELS})):
            if panels.get(name):
                with formatter.section(name):
                    formatter.write_dl(panels[name])


app = typer.Typer(
    name="qconsist",
    cls=QconsistGroup,
    help="Are your quantized ONNX models reproducible? If not, which node is to blame?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def stdout_console() -> Console:
    """The terminal's width on a terminal; piped (CI logs, files), nothing is wrapped or cut. Markup is off:
    tensor and node names may contain "[...]"."""
    width = None if sys.stdout.isatty() else 100_000
    return Console(highlight=False, soft_wrap=True, markup=False, width=width)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def note_ort_log(log: Any) -> None:
    """One line on stderr for onnxruntime's own log lines, which the run directory keeps (``OrtLog``); inside a
    command, said by the boundary after the command, with the rest of its onnxruntime log."""
    if log is None or not log.lines:
        return
    if _notes is not None:
        _notes.append(log)
        return
    stderr_console().print(f"note: {log.summary()}")


def note_run_ort_log(run_dir: Any) -> None:
    """``note_ort_log`` for the log a complete run directory kept (its manifest's ``onnxruntime_log``)."""
    from qconsist.store.ortlog import OrtLog
    from qconsist.store.run import Run

    recorded = Run.open(run_dir).sections.get("onnxruntime_log")
    note_ort_log(OrtLog.from_json(recorded) if isinstance(recorded, dict) else None)


def print_json(data: Any) -> None:
    from qconsist.store.serde import dumps

    sys.stdout.write(dumps(data))


def show_progress(json_output: bool) -> bool:
    """Progress bars only on an interactive terminal, never under --json or in CI."""
    return not json_output and sys.stderr.isatty() and not os.environ.get("CI")


class RichProgress:
    """``qconsist.progress.Progress`` drawn with rich on stderr."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
        )
        from rich.text import Text

        class Rate(ProgressColumn):
            """Items per second (samples, calibrations…)."""

            def render(self, task: Any) -> Text:
                speed = task.finished_speed or task.speed
                return Text(f"{speed:,.0f}/s" if speed else "", style="progress.data.speed")

        class Remaining(ProgressColumn):
            """The time left from the mean time per item so far: known from the first item done (rich's own
            column waits for a speed measured over several updates: a nightly of 5 entries showed -:--:--
            until the third)."""

            def render(self, task: Any) -> Text:
                from qconsist.progress import clock_text

                if not task.total or not task.completed or not task.elapsed:
                    return Text("-:--:--", style="progress.remaining")
                left = task.elapsed / task.completed * max(task.total - task.completed, 0)
                return Text(clock_text(left), style="progress.remaining")

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
            Remaining(), console=stderr_console(), transient=True,
        )
        self._open = 0

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Any]:
        task_id = self._progress.add_task(description, total=total)
        progress = self._progress

        class Handle:
            def advance(self, amount: int = 1) -> None:
                progress.advance(task_id, amount)

        # Tasks nest and overlap (the nightly on Ray: one line per running entry): the display lives while any does.
        if not self._open:
            progress.start()
        self._open += 1
        try:
            yield Handle()
        finally:
            progress.remove_task(task_id)
            self._open -= 1
            if not self._open:
                progress.stop()


def progress_for(json_output: bool):  # -> Progress
    """Bars on an interactive terminal; plain lines on stderr where no one watches live (CI, a pipe, a file:
    ``qconsist.progress.ProgressLines``); nothing under --json or -q."""
    from qconsist.progress import NULL_PROGRESS

    if json_output or QconsistGroup.verbosity < 0:
        return NULL_PROGRESS
    if show_progress(json_output):
        return RichProgress()
    from qconsist.progress import ProgressLines

    return ProgressLines()


def _version_callback(value: bool) -> None:
    if value:
        from qconsist import __version__

        typer.echo(f"qconsist {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the library does, and show tracebacks (also after the command)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only errors on stderr (also after the command)."),
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version."),
) -> None:
    """Are your quantized ONNX models reproducible? If not, which node is to blame?"""
