# SPDX-License-Identifier: Apache-2.0
"""Load CosyVoice3's `flow.pt` (+ the `flow:` section of `cosyvoice3.yaml`), and write deterministic stand-ins.

A Fun-CosyVoice3 directory holds `cosyvoice3.yaml` and `flow.pt`. The config comes from the yaml when
present (`config.flow_config_from_yaml`), else `REAL_FLOW_CONFIG` (vLLM-Omni 0.30 hard-codes the same
values). Loading is strict: the model is built in float32 with explicit dtypes (a bf16 process
default changes nothing), halved first when `float16` (the RoPE `inv_freq` stays float32), the key set
and every shape checked with errors naming the file and tensor, then `load_state_dict(strict=True)`.

Stand-ins (`write_standin_flow`): `flow.pt` with seeded weights of the exact layout (330 keys,
332,257,088 parameters, 1.3 GB at full size; the persistent `rotary_embed.inv_freq` holds the real
RoPE frequencies) and a `cosyvoice3.yaml` with its `flow:` section, cached per size and seed under
`vllm_omni_token2wav.envs.cache_dir("standins")` by `ensure_standin_flow`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.config import (
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    CosyVoice3FlowConfig,
    flow_config_from_yaml,
    render_cosyvoice3_yaml,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import CausalMaskedDiffWithDiT
from vllm_omni_token2wav.model_executor.model_loader.state_dict import (
    ensure_cached_files,
    load_checked,
    standin_state_dict,
    write_standin_files,
)

logger = init_logger(__name__)

CONFIG_YAML = "cosyvoice3.yaml"
FLOW_PT = "flow.pt"
#: Bump when the stand-in recipe changes so cached files are regenerated.
STANDIN_VERSION = 1


def write_standin_flow(directory: str | Path, *, reduced: bool, seed: int) -> tuple[Path, Path]:
    """Write `cosyvoice3.yaml` + `flow.pt` (deterministic in `seed`) into `directory`; returns their paths."""
    config = REDUCED_FLOW_CONFIG if reduced else REAL_FLOW_CONFIG
    return write_standin_files(
        Path(directory),
        lambda: standin_state_dict(CausalMaskedDiffWithDiT(config), seed),
        weights_name=FLOW_PT,
        config_name=CONFIG_YAML,
        config_text=render_cosyvoice3_yaml(config),
        what=f"{'reduced' if reduced else 'full-size'} stand-in CosyVoice3 flow (seed {seed})",
    )


def standin_flow_dir(*, reduced: bool, seed: int) -> Path:
    """Cache folder of the stand-in flow for these options (under `vllm_omni_token2wav.envs.cache_dir`)."""
    from vllm_omni_token2wav import envs

    size = "reduced" if reduced else "full"
    return envs.cache_dir("standins", f"cosyvoice3-flow-v{STANDIN_VERSION}-{size}-seed{seed}")


def ensure_standin_flow(*, reduced: bool, seed: int = 0) -> Path:
    """Folder holding a cached stand-in `cosyvoice3.yaml` + `flow.pt`, written first if missing (process-safe)."""
    return ensure_cached_files(
        standin_flow_dir(reduced=reduced, seed=seed),
        (FLOW_PT, CONFIG_YAML),
        lambda directory: write_standin_flow(directory, reduced=reduced, seed=seed),
    )


def _resolve(source: str | Path | tuple[str | Path | None, str | Path]) -> tuple[Path | None, Path]:
    if isinstance(source, tuple):
        yaml_path = None if source[0] is None else Path(source[0])
        pt_path = Path(source[1])
    else:
        directory = Path(source)
        yaml_path = directory / CONFIG_YAML if (directory / CONFIG_YAML).is_file() else None
        pt_path = directory / FLOW_PT
    if not pt_path.is_file():
        raise FileNotFoundError(
            f"flow model file not found: {pt_path} (a Fun-CosyVoice3 directory holds flow.pt + cosyvoice3.yaml)"
        )
    if yaml_path is not None and not yaml_path.is_file():
        raise FileNotFoundError(f"cosyvoice3.yaml not found: {yaml_path}")
    return yaml_path, pt_path


def load_flow(
    source: str | Path | tuple[str | Path | None, str | Path],
    *,
    device: torch.device | str | None = None,
    float16: bool = False,
    dtype: torch.dtype | None = None,
    config: CosyVoice3FlowConfig | None = None,
) -> CausalMaskedDiffWithDiT:
    """Build and load the flow from a model directory or a `(cosyvoice3.yaml or None, flow.pt)` pair.

    `config` overrides the yaml (and the default `REAL_FLOW_CONFIG` when there is none). `device`
    defaults to the platform's serving device. Raises ValueError naming missing / unexpected /
    wrongly shaped keys.
    """
    yaml_path, pt_path = _resolve(source)
    if config is not None:
        against = "the given config"
    elif yaml_path is not None:
        config, against = flow_config_from_yaml(yaml_path), yaml_path.name
    else:
        config, against = REAL_FLOW_CONFIG, "REAL_FLOW_CONFIG (no cosyvoice3.yaml next to flow.pt)"
    # every tensor of the model (the RoPE buffer included) comes from flow.pt: no random init, and no
    # memory until the file's layout has been checked (load_checked materialises it)
    with torch.device("meta"):
        model = CausalMaskedDiffWithDiT(config)
    load_checked(
        model,
        pt_path,
        device=device,
        float16=float16,
        dtype=dtype,
        against=against,
        hint="is this CosyVoice3's flow.pt (CausalMaskedDiffWithDiT), with the cosyvoice3.yaml of the same model?",
        what="CosyVoice3 flow",
    )
    return model
