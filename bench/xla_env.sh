#!/usr/bin/env bash
# Build the opt-in torch-xla environment for bench/xla_check.py, outside the repo.
#   bash bench/xla_env.sh [VENV]        # default /work/xla-venv; prints its size at the end
# torch-xla 2.9 pins torch 2.9; PyPI's x86_64 torch 2.9 is the CUDA build (its nvidia-* wheels
# are needed to import it), and no CPU wheel index is reachable from this machine.
set -euo pipefail
VENV="${1:-/work/xla-venv}"
python3 -m venv "$VENV"
# the host's pip constraints cap torch for difflet's own venv; this venv pins its own versions
export PIP_CONSTRAINT=""
"$VENV/bin/pip" install --no-input --index-url https://pypi.org/simple torch==2.9.0 torch-xla==2.9.0
# difflet's install_requires (setup.cfg) at the versions difflet's main venv runs
"$VENV/bin/pip" install --no-input --index-url https://pypi.org/simple \
    diffusers==0.42.1 transformers==5.24.0 tokenizers "lark>=1.2" "msgspec>=0.18" zstandard \
    "grpcio>=1.85.1" grpcio-health-checking grpcio-reflection "protobuf>=7.35" "click>=8.1" \
    safetensors pillow "av>=14" accelerate numpy prometheus-client
du -sh "$VENV"
