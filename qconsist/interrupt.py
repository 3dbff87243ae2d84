"""Ctrl-C and SIGTERM in the ``qconsist`` command: one line, ``error: interrupted``, and exit 130, whenever they
come — from the command's first instruction to the process's end (docs/trust.md, "Exit codes").

Python raises ``KeyboardInterrupt`` at whatever Python instruction the main thread runs next. Five places of a
command's life could not take it up (found by SIGINT sent from outside at many delays, and from inside at
chosen instants; ``tests/store/test_signals.py`` sends both):

* **an extension module's load**: a ``KeyboardInterrupt`` raised after the module was created but before it is in
  ``sys.modules`` (importlib's ``_load_unlocked``, Python code around the C init) discards the new module, and
  onnx's nanobind module crashes when discarded (SIGSEGV, or ``terminate called after throwing an instance of
  'nanobind::python_error'``, exit 134); raised inside a C++ init, onnxruntime's pybind11 module turns it into
  ``ImportError: initialization failed``, said as an internal error with exit 4;
* **a finalizer or a weakref callback** (importlib's module locks have one): a ``KeyboardInterrupt`` raised in
  one is printed, "Exception ignored in: …" and its traceback, and lost — the command went on to exit 0;
* **typer's parsing** of the command line (``typer.core._main``, which imports pydantic there) turns any
  ``KeyboardInterrupt`` outside the command into exit 130 **without a word**;
* **the first instructions of ``main``**, before its guard: Python's default handler, a traceback and -2;
* **the interpreter's teardown** after the last ``atexit`` callback (0.2-0.5 s for a command that loaded
  onnxruntime), where Python puts the default handlers back: -2, no line.

So :func:`install`, the first thing ``qconsist.__main__.main`` does, takes both signals. Its :func:`handler`
raises :class:`Interrupted` (SIGINT) or :class:`Terminated` (SIGTERM) at once, except while an extension module is
loaded (:func:`deferred`): then the signal is kept and raised when the module is in ``sys.modules``, a point where
Python code can stop. One raised in a finalizer is signalled again, to be raised once the finalizer is done.
:func:`finish` gives the process its exit code: 130, with the line said once (:func:`say`), whenever a signal
came — whatever swallowed or converted the ``KeyboardInterrupt`` on its way up. From then on a signal says the
line and ends the process at once, and the last ``atexit`` callback ends the process with that code
(``os._exit``, standard streams flushed) instead of the teardown: every ``atexit`` callback has run (the input
workers', logging's, the temporary folders'), what is left only frees memory.

What is left to Python is the interpreter's own start before ``qconsist.__main__`` runs (its ``site`` module,
the editable install's finder: 15-50 ms here), where a Ctrl-C ends in CPython's own error.

This module imports nothing heavy: it is loaded before anything else of the command.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from contextlib import contextmanager
from typing import Any, Iterator

EXIT_INTERRUPTED = 130  # qconsist.errors.EXIT_INTERRUPTED, without importing it before the handler is there

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C), raised where the main thread can stop."""


class Terminated(Interrupted):
    """SIGTERM (a CI job cancelled, ``kill``): handled as Ctrl-C, so temporary files and half-written outputs are
    cleaned up on the way out and the exit code is 130."""


class _State:
    installed = False
    received: int | None = None  # the first signal since install
    pending: int | None = None  # a signal kept while deferred
    depth = 0  # deferred blocks open
    exit_code: int | None = None  # set by finish: the outcome is final
    said = False


def _raise(signum: int) -> None:
    raise Terminated() if signum == signal.SIGTERM else Interrupted()


def handler(signum: int, frame: Any) -> None:
    """The handler of SIGINT and SIGTERM (see the module docstring); before :func:`install` (the command line
    called in a test's process, for SIGTERM) it raises at once."""
    if not _State.installed:
        _raise(signum)
    if _State.exit_code is not None:
        say()
        os._exit(EXIT_INTERRUPTED)
    if _State.received is None:
        _State.received = signum
    if _State.depth:
        _State.pending = signum
        return
    _raise(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """A block the handler does not interrupt: a signal that comes meanwhile is raised when the block ends."""
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if not _State.depth and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            _raise(signum)


def _deferring(load: Any, extension: type) -> Any:
    """importlib's ``_load_unlocked`` (create the module, put it in ``sys.modules``, execute it), inside
    :func:`deferred` for an extension module: a signal meanwhile is raised once the module is in ``sys.modules``."""

    def _load_unlocked(spec: Any) -> Any:
        if not isinstance(spec.loader, extension):
            return load(spec)
        with deferred():
            return load(spec)

    _load_unlocked.__wrapped__ = load  # type: ignore[attr-defined]
    return _load_unlocked


def install() -> None:
    """SIGINT and SIGTERM handled by :func:`handler`; extension modules loaded inside :func:`deferred`; a
    ``KeyboardInterrupt`` raised where Python can only print it (a finalizer, a weakref callback:
    ``sys.unraisablehook``) raised again at the next instruction; one that reaches the top said in one line with
    130 (``sys.excepthook``), not as a traceback; the process ended by its last ``atexit`` callback once
    :func:`finish` gave its code. In the main thread, once."""
    if _State.installed:
        return
    from importlib import _bootstrap  # type: ignore[attr-defined]
    from importlib.machinery import ExtensionFileLoader

    for signum in _SIGNALS:
        signal.signal(signum, handler)
    if hasattr(_bootstrap, "_load_unlocked"):  # CPython 3.11-3.14: what every import calls to load a module
        _bootstrap._load_unlocked = _deferring(_bootstrap._load_unlocked, ExtensionFileLoader)
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        if issubclass(kind, KeyboardInterrupt):  # one that came in the few instructions outside main's try
            say()
            os._exit(EXIT_INTERRUPTED)
        previous(kind, value, traceback)

    previous_unraisable = sys.unraisablehook

    def unraisablehook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_unraisable(unraisable)
            return
        # raised where nothing could take it up: signalled again from another thread, to be raised after this
        # hook (a signal raised here would be taken up here); should it land in a finalizer again, so again
        import threading

        signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        threading.Timer(0.001, signal.pthread_kill, (threading.main_thread().ident, signum)).start()

    sys.excepthook = excepthook
    sys.unraisablehook = unraisablehook
    atexit.register(_end)  # registered first, so called last
    _State.installed = True


def _end() -> None:
    """The last ``atexit`` callback: the process ends here with :func:`finish`'s code (see the module docstring);
    without one (an exception escaped ``main``) the teardown goes on, both signals ignored."""
    if _State.exit_code is None:
        for signum in _SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        return
    _flush()
    os._exit(_State.exit_code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def received() -> bool:
    """Whether SIGINT or SIGTERM came since :func:`install`."""
    return _State.received is not None


def say() -> None:
    """``error: interrupted`` on stderr: once in the ``qconsist`` process (after :func:`install`), at each call in
    another (the command line called in a test's process)."""
    if _State.said:
        return
    _State.said = _State.installed
    _flush()
    try:
        sys.stderr.write("error: interrupted\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        os.write(2, b"error: interrupted\n")


def finish(code: Any) -> Any:
    """The process's exit code for the command's ``code`` (a ``SystemExit`` code): 130 with the line said once
    when a signal came or the command ended with 130. From now on a signal ends the process at once (130)."""
    if received() or code == EXIT_INTERRUPTED:
        say()
        code = EXIT_INTERRUPTED
    _State.exit_code = code if isinstance(code, int) else 0 if code is None else 1
    return code
