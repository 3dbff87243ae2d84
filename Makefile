# The two commands a new user types (README): `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup clean browser

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	# caffe2onnx 2.0.1 pins onnx==1.6.0, which does not build on current Python; its real
	# requirements (onnx, protobuf) are already installed, so it is installed without them.
	$(BIN)/python -m pip install -q --no-deps 'caffe2onnx==2.0.1'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/qconsist pipeline run pipelines/open_nsfw.toml

test: $(STAMP) browser
	$(BIN)/python -m pytest -q -m "not gpu"

# The HTML report tests render in Debian's headless chromium; install it where it is missing and we are root.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi

clean:
	rm -rf $(VENV) runs .pytest_cache
