# SPDX-License-Identifier: Apache-2.0
"""The flow's dtype of a Token2Wav stage: the `token2wav_dtype` option, upstream's `token2wav_float16`, and
the platform's default.

Why a module: the dtype a stage's flow runs in is a deployment choice (issue 33): reduced precision by
default on accelerators, fp32 on CPU, fp32 kept on request. The rule, in order:

| given                                                | the flow runs in                                      |
|------------------------------------------------------|-------------------------------------------------------|
| `token2wav_dtype: float32 / float16 / bfloat16`      | that dtype                                            |
| `token2wav_float16: true` (connector `extra`, or     | float16 (upstream's key: MiniCPM-o reads `extra`,     |
| Step-Audio2's `hf_config.token2wav_float16`)         | Step-Audio2 its `hf_config`)                          |
| `token2wav_float16: false`, given explicitly         | float32 (upstream's meaning of the key: fp32)         |
| nothing, or `token2wav_dtype: auto`                  | the platform's `default_flow_dtype()`: float32 on a   |
|                                                      | CPU device, float16 on CUDA and NPU                   |

Both keys given and disagreeing (`token2wav_dtype: bfloat16` with `token2wav_float16: true` or `false`)
is an error naming both. Only the flow follows this: the vocoders (HiFT, causal HiFT), the speaker
embedding (CAM++) and the speech tokenizer stay float32 (measured: docs/benchmarks/token2wav_precision.md).
The K/V arena follows the flow unless `token2wav_kv_cache_dtype` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.platforms import DeviceSpec

logger = init_logger(__name__)

DTYPE_OPTION = "token2wav_dtype"
FLOAT16_OPTION = "token2wav_float16"

_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def dtype_name(dtype: torch.dtype) -> str:
    """`float32`, `float16`, `bfloat16`."""
    return str(dtype).removeprefix("torch.")


def parse_flow_dtype(value: Any) -> torch.dtype | None:
    """`token2wav_dtype` -> a dtype, or None for `auto` / absent; ValueError naming the key otherwise."""
    if value is None or isinstance(value, torch.dtype) and value in _NAMES.values():
        return value
    text = str(value).strip().lower().removeprefix("torch.")
    if text in ("", "auto"):
        return None
    if text not in _NAMES:
        raise ValueError(
            f"{DTYPE_OPTION} must be auto, float32, float16 or bfloat16, got {value!r} "
            "(auto: float16 on CUDA and NPU, float32 on CPU)"
        )
    return _NAMES[text]


def _float16_flag(value: Any, where: str) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{where} must be true or false, got {value!r}")


def requested_flow_dtype(extra: Mapping[str, Any], hf_config: Any = None) -> torch.dtype | None:
    """The dtype the deployment asks for (module table), or None: the platform's default."""
    chosen = parse_flow_dtype(extra.get(DTYPE_OPTION))
    flags = [
        flag
        for flag in (
            _float16_flag(getattr(hf_config, FLOAT16_OPTION, None), f"hf_config.{FLOAT16_OPTION}"),
            _float16_flag(extra.get(FLOAT16_OPTION), FLOAT16_OPTION),
        )
        if flag is not None
    ]
    legacy = None if not flags else (torch.float16 if any(flags) else torch.float32)
    if chosen is not None and legacy is not None and chosen != legacy:
        raise ValueError(
            f"{DTYPE_OPTION}: {dtype_name(chosen)} contradicts {FLOAT16_OPTION}: {str(any(flags)).lower()} "
            f"(which means {dtype_name(legacy)}); remove {FLOAT16_OPTION} or make them agree"
        )
    return chosen if chosen is not None else legacy


def resolve_flow_dtype(requested: torch.dtype | None, device: DeviceSpec, platform: Any = None) -> torch.dtype:
    """The flow's dtype: `requested`, else float32 on a CPU device, else the platform's `default_flow_dtype()`.

    `platform` defaults to `current_omni_platform` (tests pass a fake one); `device` None means the platform's
    serving device.
    """
    if requested is not None:
        return requested
    if platform is None:
        from vllm_omni_token2wav import platforms

        platform = platforms.current_omni_platform
    # None and a bare index name the platform's device type; a string or torch.device names its own (a string
    # is split by hand: `torch.device("npu")` only parses once torch_npu is imported)
    if device is None or isinstance(device, int):
        device_type = platform.device_type
    elif isinstance(device, str):
        device_type = device.split(":", 1)[0].strip().lower()
    else:
        device_type = torch.device(device).type
    if device_type == "cpu":
        return torch.float32
    chosen = platform.default_flow_dtype()
    if chosen != torch.float32:
        logger.info(
            "token2wav flow in %s on %s (%s's default, %s: auto); %s: float32 keeps it in fp32",
            dtype_name(chosen),
            device_type,
            type(platform).__name__,
            DTYPE_OPTION,
            DTYPE_OPTION,
        )
    return chosen


__all__ = [
    "DTYPE_OPTION",
    "FLOAT16_OPTION",
    "dtype_name",
    "parse_flow_dtype",
    "requested_flow_dtype",
    "resolve_flow_dtype",
]
