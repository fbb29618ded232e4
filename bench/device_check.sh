#!/usr/bin/env bash
# The prepared accelerator check (issue 34 item 6), one call of the device tool:
#   run(command="bash bench/device_check.sh", carry=[".whl"], timeout_s=590)
# Here, first:
#   bash bench/device_check.sh --wheels    # the wheels the device image lacks, cp312, into .whl/
#   bash bench/device_check.sh --dry-run   # the wheels checked against Python 3.12 and every stage
#                                          # of bench/device_check.py on this CPU at toy size
# The device image (/work/.library/device/KINDS.md) has Python 3.12, torch 2.11 (CUDA 13),
# transformers, safetensors, tokenizers, accelerate, peft, pillow, numpy, click, prometheus-client;
# WHEELS are Difflet's other requirements (setup.cfg) at the versions its tests run here. av is
# left out: only video output imports it, and the served request is an image.
# Results: $OUT/device_check.json (+ the two served PNGs and the logs); stages that fail are
# reported in the JSON and the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(diffusers==0.42.1 lark==1.3.1 msgspec==0.23.0 zstandard==0.25.0 grpcio==1.85.4
        grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2 fastapi==0.165.0
        starlette==1.10.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0
        typing-inspection==0.4.2 uvicorn==0.55.0 python-multipart==0.0.34)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
py312() {  # a Python 3.12 here (the device's version), to check the wheels' tags against
  for py in "${PY312:-}" python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
    [ -n "$py" ] && "$py" -c "" 2>/dev/null && { echo "$py"; return; }
  done
  echo "error: no Python 3.12 here to check the carried wheels with (set PY312)" >&2; exit 2
}

wheel_names() {  # the distribution names of WHEELS, as wheel files spell them
  for w in "${WHEELS[@]}"; do echo "${w%%==*}" | tr '-' '_'; done
}

case "${1:-}" in
  --wheels)
    mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
    du -sh .whl
    exit 0 ;;
  --dry-run)
    for name in $(wheel_names); do
      ls .whl/ 2>/dev/null | grep -qi "^${name}-" || { echo "error: .whl/ lacks ${name}: run bash bench/device_check.sh --wheels" >&2; exit 2; }
    done
    # every carried wheel installs into Python 3.12 (tags, metadata) without the network
    PY="$(py312)"
    "$PY" -m pip install -q --dry-run --no-index --no-deps --ignore-installed --target "$(mktemp -d)" .whl/*.whl
    echo "carried wheels: ${#WHEELS[@]} for cp312, $(du -sh .whl | cut -f1)"
    OUT="${OUT:-$(mktemp -d)}"
    exec python3 bench/device_check.py --dry-run --out "$OUT" ;;
  "") ;;
  *) echo "usage: bash bench/device_check.sh [--wheels | --dry-run]" >&2; exit 2 ;;
esac

# on the device machine
: "${OUT:?OUT is the device tool's output folder}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 560 python3 bench/device_check.py --out "$OUT" 2>&1 | tee "$OUT/device_check.log"
