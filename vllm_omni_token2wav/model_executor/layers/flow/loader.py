# SPDX-License-Identifier: Apache-2.0
"""Load `flow.yaml` + `flow.pt` onto the serving device, and write deterministic stand-ins of them.

Loading follows the reference: build from the YAML, `.half()` first when `float16` (so fp16 weights
load into fp16 parameters), `load_state_dict(strict=True)`, move to the device, `eval()`. Modules are
built in float32 with explicit dtypes, so a bf16 process default (vLLM's model loading) changes nothing.

Stand-ins: models cannot be downloaded in CI, so `write_standin_flow` writes a `flow.yaml` (the real
hyperparameters, or `REDUCED_FLOW_CONFIG`) and a `flow.pt` with seeded random weights of the exact
key layout. The end-to-end Token2Wav stand-in directory is assembled from these.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow.config import (
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    build_flow_from_yaml,
    render_flow_yaml,
)
from vllm_omni_token2wav.model_executor.layers.flow.flow import CausalMaskedDiffWithXvec
from vllm_omni_token2wav.model_executor.model_loader.state_dict import (
    ensure_cached_files,
    load_checked,
    standin_state_dict,
    write_standin_files,
)

logger = init_logger(__name__)

FLOW_YAML = "flow.yaml"
FLOW_PT = "flow.pt"


def write_standin_flow(directory: str | Path, *, reduced: bool, seed: int) -> tuple[Path, Path]:
    """Write `flow.yaml` + `flow.pt` (deterministic in `seed`) into `directory`; returns their paths.

    Existing files are replaced atomically. Full size writes ~623 MB of float32 weights.
    """
    text = render_flow_yaml(REDUCED_FLOW_CONFIG if reduced else REAL_FLOW_CONFIG)
    return write_standin_files(
        Path(directory),
        lambda: standin_state_dict(build_flow_from_yaml(text), seed),
        weights_name=FLOW_PT,
        config_name=FLOW_YAML,
        config_text=text,
        what=f"{'reduced' if reduced else 'full-size'} stand-in flow (seed {seed})",
    )


def standin_flow_dir(*, reduced: bool, seed: int) -> Path:
    """Cache folder of the stand-in flow for these options (under `vllm_omni_token2wav.envs.cache_dir`)."""
    from vllm_omni_token2wav import envs

    return envs.cache_dir("standins", f"flow-{'reduced' if reduced else 'full'}-seed{seed}")


def ensure_standin_flow(*, reduced: bool, seed: int = 0) -> Path:
    """Folder holding a cached stand-in `flow.yaml` + `flow.pt`, written first if missing.

    Safe to call from several processes at once: a file lock serialises the writers and the files
    appear atomically. Pass the folder to `load_flow`.
    """
    return ensure_cached_files(
        standin_flow_dir(reduced=reduced, seed=seed),
        (FLOW_PT, FLOW_YAML),
        lambda directory: write_standin_flow(directory, reduced=reduced, seed=seed),
    )


def _resolve(source: str | Path | tuple[str | Path, str | Path]) -> tuple[Path, Path]:
    if isinstance(source, tuple):
        yaml_path, pt_path = Path(source[0]), Path(source[1])
    else:
        yaml_path, pt_path = Path(source) / FLOW_YAML, Path(source) / FLOW_PT
    for p in (yaml_path, pt_path):
        if not p.is_file():
            raise FileNotFoundError(f"flow model file not found: {p} (a token2wav directory holds flow.yaml + flow.pt)")
    return yaml_path, pt_path


def load_flow(
    source: str | Path | tuple[str | Path, str | Path],
    *,
    device: torch.device | str | None = None,
    float16: bool = False,
    dtype: torch.dtype | None = None,
    noise_seed: int = 0,
) -> CausalMaskedDiffWithXvec:
    """Build and load the flow model from a token2wav directory or a `(flow.yaml, flow.pt)` pair.

    `device` defaults to the platform's serving device. `float16` halves the model before loading
    (reference behaviour). Raises ValueError naming missing / unexpected / wrongly shaped keys.
    """
    yaml_path, pt_path = _resolve(source)
    model = build_flow_from_yaml(yaml_path, noise_seed=noise_seed)
    load_checked(
        model,
        pt_path,
        device=device,
        float16=float16,
        dtype=dtype,
        against=yaml_path.name,
        hint=f"is this the flow.pt that belongs to this {yaml_path.name}?",
        what="flow model",
    )
    return model
