# The two commands a new user types (README): `make run` and `make test`.
# Both install exactly what uv.lock says (uv sync --locked): the lock is the environment.
PY ?= python3
VENV := .venv
TOOLS := .tools
UV := $(TOOLS)/bin/uv
# onnxruntime's build: cpu, or gpu on a GPU machine (make run ORT=gpu, make test ORT=gpu).
ORT ?= cpu
# What the main job needs (docs/install.md, "Set-up"): onnxruntime, Caffe conversion, the photographs it calibrates on.
RUN_EXTRAS ?= $(ORT) caffe photos
# The tests add Model Explorer, Ray, pytest and hypothesis (the `test` group); nox and ruff come with them.
EXTRAS ?= $(RUN_EXTRAS)
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
# make run keeps what is there (--inexact): after make test, nothing is uninstalled.
SYNC_RUN := $(UV) sync --locked --inexact --python $(PY) $(addprefix --extra ,$(RUN_EXTRAS))
SYNC := $(UV) sync --locked --python $(PY) $(addprefix --extra ,$(EXTRAS)) --group test --group matrix --group lint
# Every core (pytest-xdist): a module at a time per worker, the Ray modules in one worker (tests/conftest.py).
PYTEST := $(VENV)/bin/python -m pytest -q -m "not gpu" -n auto
export UV_PYTHON_DOWNLOADS := never
# Bytecode written at install: uv compiles what it installs (UV_COMPILE_BYTECODE: make setup, make run, nox's
# venvs), compileall qconsist's own modules (installed editable, they are not in site-packages; again before each
# job, which compiles only what was edited since). Where PYTHONDONTWRITEBYTECODE is set (this project's CI machines)
# every interpreter — each test's `qconsist` process, each input worker — would otherwise compile every module it
# imports (here, medians of 7 alternating: `qconsist --help` 0.84 s without, 0.31 s with; a 1-sample `qconsist run` of
# open_nsfw QDQ 1.77 s, 1.02 s). A Ctrl-C at any instant of that faster start is one line and 130
# (qconsist/interrupt.py, tests/store/test_signals.py).
export UV_COMPILE_BYTECODE := 1
COMPILE := $(VENV)/bin/python -m compileall -q -j 0 qconsist

.PHONY: run test check setup lock lock-uv matrix lint clean browser qemu docs

# uv itself, pinned with its hashes in requirements/uv.txt, in a venv of its own.
$(UV): requirements/uv.txt
	$(PY) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q --require-hashes --no-deps -r requirements/uv.txt
	touch $(UV)

$(RUN_STAMP): pyproject.toml uv.lock $(UV)
	$(SYNC_RUN)
	$(COMPILE)
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml uv.lock $(UV)
	$(SYNC)
	$(COMPILE)
	touch $(STAMP) $(RUN_STAMP)

setup: $(STAMP)

run: $(RUN_STAMP)
	@$(COMPILE)
	$(VENV)/bin/qconsist pipeline run pipelines/open_nsfw.toml

test: $(STAMP) browser qemu
	@$(COMPILE)
	$(PYTEST)

# The quick tier while developing (under a minute on 2 idle cores): every test but the `slow` ones (the real
# open_nsfw pipeline run, nights, subprocesses, fuzzing: tests/conftest.py); `make test` runs them all.
check: $(STAMP)
	@$(COMPILE)
	$(PYTEST) -m "not gpu and not slow"

# docs/cli.md, the CLI reference, from every command's --help (tests/test_docs.py fails when it is stale).
docs: $(STAMP)
	$(VENV)/bin/python tools/cli_reference.py

lint: $(STAMP)
	$(VENV)/bin/ruff check qconsist tests benchmarks tools noxfile.py

# Other onnxruntime versions against the locked environment (noxfile.py): oldest supported, locked, newest.
matrix: $(STAMP)
	PATH="$(abspath $(TOOLS))/bin:$$PATH" $(VENV)/bin/nox $(NOX_ARGS)

# After editing pyproject.toml (a new dependency, a new onnxruntime pin): re-resolve and commit uv.lock.
lock: $(UV)
	$(UV) lock --python $(PY)

lock-uv: $(UV)
	cd requirements && ../$(UV) pip compile --universal --generate-hashes --python-version 3.11 uv.in -o uv.txt \
		--custom-compile-command "make lock-uv"

# The HTML report tests render in Debian's headless chromium; install it where it is missing and we are root.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi

# --isa, locate --ep cpu and calib repeat --isa run models under QEMU user mode emulating another processor
# (Debian's qemu-user: qemu-x86_64); install it where it is missing and we are root, as chromium above.
qemu:
	@if ! command -v qemu-x86_64 >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null; fi

clean:
	rm -rf $(VENV) $(TOOLS) runs .pytest_cache .nox
