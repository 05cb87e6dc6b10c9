# SPDX-License-Identifier: Apache-2.0
"""Environment variables read by vllm_omni, in one place (like vLLM's `vllm.envs`).

| variable                  | meaning                                                    | default                   |
|---------------------------|------------------------------------------------------------|---------------------------|
| `VLLM_OMNI_PLATFORM`      | force the platform: auto, cpu, cuda, npu                   | auto                      |
| `VLLM_OMNI_LOGGING_LEVEL` | level of the `vllm_omni` loggers                           | INFO                      |
| `VLLM_OMNI_CACHE_DIR`     | generated stand-in assets, TensorRT engines, file caches   | `$XDG_CACHE_HOME/vllm_omni` |
| `VLLM_OMNI_*_BUCKETS`     | padded shape sets (see `model_executor/buckets.py`)        | per set                   |
| `STEP_AUDIO2_DEFAULT_PROMPT_WAV` | Step-Audio2 stage's default voice file (upstream's name, `token2wav_stage/families.py`) | `default_female.wav` lookup |

Values are read on every call (not frozen at import) so tests and long-lived processes see changes.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The project's file cache (created on demand), optionally a subfolder of it."""
    base = os.environ.get("VLLM_OMNI_CACHE_DIR")
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "vllm_omni"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
