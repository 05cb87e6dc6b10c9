#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build a virtual environment with README.md's install lines and nothing else, then run the README's
# `bench engine-ab` from it (smoke size): the serving install must be enough for the commands the README
# shows (issue: the upstream arm died on `No module named 'librosa'`, which only the dev extra had).
# Each line run here must appear verbatim in README.md (checked first), so the two cannot drift apart.
# Usage: bash tools/readme_install_smoke.sh [VENV_DIR] [OUT_DIR]   (defaults .venv-readme, $VENV_DIR/smoke)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV_DIR="${1:-.venv-readme}"
OUT_DIR="${2:-$VENV_DIR/smoke}"
PYTHON="${PYTHON:-python3}"
start=$(date +%s)

# README's lines, in the README's order (Install, then the engine row of its table).
INSTALL_LINES=(
    'pip install torch==2.13.0'
    'pip install -e ".[bench]"'
    'bash tools/install_engine_cpu.sh .venv'
)
for line in "${INSTALL_LINES[@]}"; do
    if ! grep -qF -- "$line" README.md; then
        echo "readme-smoke: README.md no longer contains the install line: $line" >&2
        exit 1
    fi
done

[ -x "$VENV_DIR/bin/python" ] || "$PYTHON" -m venv "$VENV_DIR"
# An activated venv's `pip` is `$VENV_DIR/bin/python -m pip`; `.venv` in the engine line is that venv.
"$VENV_DIR/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
"$VENV_DIR/bin/python" -m pip install -q --disable-pip-version-check -e ".[bench]"
bash tools/install_engine_cpu.sh "$VENV_DIR"
echo "readme-smoke: venv ready in $(( $(date +%s) - start )) s"

mkdir -p "$OUT_DIR"
# Both arms (upstream's class with VLLM_OMNI_TOKEN2WAV_OVERRIDES=0, ours) must answer: exit 1 otherwise.
# Its output, errors and exit code stay in OUT_DIR: CI hands them to the engine-ab test
# (tests/benchmarks/engine_ab/test_bench_engine_ab_engine.py), which checks this run instead of repeating it.
set +e
"$VENV_DIR/bin/vllm-omni-token2wav" bench engine-ab --families step_audio2 --smoke \
    --json "$OUT_DIR/engine_ab_smoke.json" --plot "$OUT_DIR/engine_ab_smoke.png" --server-logs "$OUT_DIR/logs" \
    >"$OUT_DIR/stdout.txt" 2>"$OUT_DIR/stderr.txt"
rc=$?
set -e
echo "$rc" >"$OUT_DIR/returncode"
cat "$OUT_DIR/stdout.txt"
cat "$OUT_DIR/stderr.txt" >&2
if [ "$rc" -ne 0 ]; then
    echo "readme-smoke: bench engine-ab exited $rc" >&2
    exit "$rc"
fi
echo "readme-smoke: done in $(( $(date +%s) - start )) s"
