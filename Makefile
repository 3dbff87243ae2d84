# The two commands a new user types (README): `make run` and `make test`.
# Both install exactly what uv.lock says (uv sync --locked): the lock is the environment.
PY ?= python3
VENV := .venv
TOOLS := .tools
UV := $(TOOLS)/bin/uv
STAMP := $(VENV)/.installed
# CPU build of onnxruntime, Caffe conversion, Model Explorer, the test tools. A GPU machine: make setup EXTRAS="gpu caffe explorer".
EXTRAS ?= cpu caffe explorer
SYNC := $(UV) sync --locked --python $(PY) $(addprefix --extra ,$(EXTRAS)) --group test --group matrix --group lint
export UV_PYTHON_DOWNLOADS := never

.PHONY: run test setup lock lock-uv matrix lint clean browser

# uv itself, pinned with its hashes in requirements/uv.txt, in a venv of its own.
$(UV): requirements/uv.txt
	$(PY) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q --require-hashes --no-deps -r requirements/uv.txt
	touch $(UV)

$(STAMP): pyproject.toml uv.lock $(UV)
	$(SYNC)
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/qconsist pipeline run pipelines/open_nsfw.toml

test: $(STAMP) browser
	$(VENV)/bin/python -m pytest -q -m "not gpu"

lint: $(STAMP)
	$(VENV)/bin/ruff check qconsist tests benchmarks noxfile.py

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

clean:
	rm -rf $(VENV) $(TOOLS) runs .pytest_cache .nox
