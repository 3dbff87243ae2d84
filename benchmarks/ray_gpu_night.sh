#!/usr/bin/env bash
# A night of the bundled models (pipelines/nightly.toml) on a GPU machine with the local and the Ray
# executor, side by side. The GPU machine reaches no package index: what it lacks travels as git-ignored
# folders of at most ~50 MiB (one folder per call of the device tool), gathered there, then installed.
#
#   here:   bash benchmarks/ray_gpu_night.sh prepare        # .raywhl0 .raywhl1 .qcache (+ .ortgpu0..4, see below)
#   there:  bash benchmarks/ray_gpu_night.sh install        # once every folder has arrived
#           bash benchmarks/ray_gpu_night.sh night local    # $OUT/local.json, $OUT/local.time
#           bash benchmarks/ray_gpu_night.sh night ray      # $OUT/ray.json,   $OUT/ray.time
#
# onnxruntime-gpu travels as in shared/gpu/README.md: `bash ../shared/gpu/split-ort-gpu.sh` makes .ortgpu0..4.
# Extra arguments after `night local|ray` go to `qconsist nightly` (e.g. --only fcn_head).
set -euo pipefail
root=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
PY=${PY:-python3}  # the GPU machine's python3 (3.12, with PyTorch); here: PY=.venv/bin/python
cd "$root"
case "${1:-}" in
prepare)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp" \
    ray==2.60.0 jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 \
    onnxconverter-common==1.16.0
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" caffe2onnx==2.0.1
  rm -rf .raywhl0 .raywhl1 .qcache
  mkdir -p .raywhl0 .raywhl1 .qcache
  split -b 40M -d -a 1 "$tmp"/ray-*.whl "$tmp/raypart"
  mv "$tmp/raypart0" .raywhl0/ && mv "$tmp/raypart1" .raywhl1/ && basename "$tmp"/ray-*.whl > .raywhl0/WHEEL_NAME
  mv "$tmp"/*.whl "$tmp"/*.tar.gz .raywhl1/ 2>/dev/null || true
  rm -f .raywhl1/ray-*.whl
  mkdir -p .qcache/models && [ -d "$HOME/.cache/qconsist/models" ] && cp -r "$HOME/.cache/qconsist/models/." .qcache/models/  # fetch verifies them
  QCONSIST_CACHE="$root/.qcache" .venv/bin/qconsist models fetch open_nsfw
  QCONSIST_CACHE="$root/.qcache" .venv/bin/qconsist models fetch nudenet_320n
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  for d in .raywhl0 .raywhl1 .qcache; do grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"; done
  du -sh .raywhl0 .raywhl1 .qcache
  ;;
install)
  mkdir -p /tmp/ortgpu /tmp/site
  cp .ortgpu*/* /tmp/ortgpu/
  (cd /tmp/ortgpu && cat part* > "$(cat WHEEL_NAME)")
  cat .raywhl0/raypart0 .raywhl1/raypart1 > "/tmp/$(cat .raywhl0/WHEEL_NAME)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/ortgpu/"$(cat /tmp/ortgpu/WHEEL_NAME)" "/tmp/$(cat .raywhl0/WHEEL_NAME)" .raywhl1/*.whl
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .raywhl1/caffe2onnx-*.tar.gz
  PYTHONPATH=/tmp/site:$root "$PY" -c "import onnxruntime as o, ray; print(o.__version__, o.get_available_providers(), ray.__version__)"
  ;;
night)
  executor=${2:?local or ray}
  shift 2
  export PYTHONPATH=/tmp/site:$root QCONSIST_CACHE=$root/.qcache PYTHONUNBUFFERED=1 CI=1
  out=${OUT:-/tmp/out}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "no nvidia-smi"
  start=$(date +%s.%N)
  set +e
  "$PY" -c "from qconsist.cli import main; main()" nightly pipelines/nightly.toml --executor "$executor" \
    --runs-dir "/tmp/runs-$executor" --json "$@" > "$out/$executor.json" 2> "$out/$executor.err"
  code=$?
  set -e
  end=$(date +%s.%N)
  echo "executor $executor exit $code wall $("$PY" -c "print(round($end - $start, 1))") s" | tee "$out/$executor.time"
  "$PY" - "$out/$executor.json" <<'SUMMARY'
import json, sys
data = json.load(open(sys.argv[1]))
print(data["summary"], "retries:", data["retries"])
for e in data["entries"]:
    print(f"{e['status']:5} {e['model']:24} {e['gpu_label']:14} {e['seconds']:7.1f} s  {e['error'] or ''}")
SUMMARY
  ;;
*)
  echo "usage: $0 prepare | install | night local|ray [nightly options]" >&2
  exit 2
  ;;
esac
