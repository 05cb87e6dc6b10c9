# SPDX-License-Identifier: Apache-2.0
"""What every toy model folder shares: its cache location, the stand-in token2wav assets, a JSON writer.

A toy folder is assembled once per recipe under `envs.cache_dir("standins", "toy-<family>-v<N>-seed<S>")`
with `standin.token2wav_dir.ensure_assembled` (manifest + file lock: deterministic, safe across processes,
rebuilt when a component or a generated file changes). The token2wav assets are the stand-ins' reduced
`upstream_compatible` variant (`standin/model_dirs.py`): the size vLLM-Omni's own code2wav classes
hard-code for the speech tokenizer and HiFT, so one folder serves both arms (our code2wav and, with
`VLLM_OMNI_TOKEN2WAV_OVERRIDES=0`, upstream's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["json_bytes", "toy_cache_dir", "token2wav_assets"]


def json_bytes(value: Mapping[str, Any]) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


def toy_cache_dir(family: str, version: int, seed: int, root: Path | None = None) -> Path:
    """Where the toy folder of `family` lives: `root` if given, else the project's cache."""
    if root is not None:
        return Path(root)
    from vllm_omni_token2wav import envs

    return envs.cache_dir("standins", f"toy-{family}-v{version}-seed{seed}")


def token2wav_assets(seed: int) -> dict[str, Path]:
    """The reduced, upstream-compatible stand-in token2wav files (`{name: cached path}`; hidden manifest and
    lock files left out)."""
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

    folder = ensure_standin_token2wav_dir(reduced=True, seed=seed, upstream_compatible=True)
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}
