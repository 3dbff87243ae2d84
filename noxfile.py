"""The compatibility matrix: the test suite against the onnxruntime versions qconsist supports.

Each session installs the locked environment (``uv sync --locked``, as ``make test`` does) into its own venv
and then, for ``oldest`` and ``newest``, replaces onnxruntime alone:

* ``oldest``: the floor declared in pyproject.toml, ``onnxruntime>=1.31``. Older releases were tried here
  (2026-11-23) and do not give faithful results, so they are not supported:
  - <= 1.30: ``quant_pre_process(skip_symbolic_shape=True)`` throws its own optimization away (it re-saves
    the shape-inferred, unoptimized model over it): open_nsfw keeps its 53 BatchNormalization nodes,
    176 -> 176 nodes instead of 176 -> 123, and quantization then quantizes the BatchNorm scales;
  - 1.27 and 1.28: AveragePool with ceil_mode and count_include_pad divides a partial edge window wrongly
    (0.247 from Caffe's result on the "ave pool 3/2 pad 1 on 10x10" layer case): the convert stage's
    fidelity check refuses the conversion;
  - < 1.27: ``quantize_static`` has no ``calibration_cache_path``, through which qconsist quantizes from
    the ranges it calibrated and recorded itself;
* ``locked``: exactly uv.lock;
* ``newest``: the newest onnxruntime on the package index today (a moving target on purpose: it is the
  release a new user of ``pip install qconsist[cpu]`` gets).

``make matrix`` runs the three; ``.ci/run`` runs ``make test`` (the locked suite) and ``nox -s newest``.
Arguments after ``--`` go to pytest (``nox -s oldest -- tests/pipeline``).
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["oldest", "locked", "newest"]
nox.options.error_on_external_run = True

OLDEST_ONNXRUNTIME = "1.31.0"
# every core, as make test runs the suite (pytest-xdist; the scheduling is tests/conftest.py's)
PYTEST = ["python", "-m", "pytest", "-q", "-m", "not gpu", "-n", "auto", "-p", "no:cacheprovider"]


def _locked(session: nox.Session) -> None:
    """The lock, installed into the session's venv (not the project's .venv)."""
    env = {"UV_PROJECT_ENVIRONMENT": session.virtualenv.location, "UV_PYTHON_DOWNLOADS": "never"}
    session.run_install(
        "uv", "sync", "--locked", "--extra", "cpu", "--extra", "caffe", "--extra", "photos", "--group", "test",
        env=env, external=True,
    )


def _suite(session: nox.Session) -> None:
    session.run("python", "-c", "import onnxruntime, onnx, numpy; "
                "print('onnxruntime', onnxruntime.__version__, 'onnx', onnx.__version__, 'numpy', numpy.__version__)")
    session.run(*PYTEST, *session.posargs, env={"QCONSIST_MATRIX": session.name})


# python=None: the interpreter that runs nox (the project's .venv, made from the lock).
@nox.session(python=None)
def locked(session: nox.Session) -> None:
    _locked(session)
    _suite(session)


@nox.session(python=None)
def oldest(session: nox.Session) -> None:
    _locked(session)
    session.run_install("uv", "pip", "install", "--no-config", f"onnxruntime=={OLDEST_ONNXRUNTIME}", external=True)
    _suite(session)


@nox.session(python=None)
def newest(session: nox.Session) -> None:
    _locked(session)
    session.run_install("uv", "pip", "install", "--no-config", "--upgrade", "onnxruntime", external=True)
    _suite(session)
