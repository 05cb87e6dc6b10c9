# SPDX-License-Identifier: Apache-2.0
"""Which device the ASR runs on: the option, else `SEED_TTS_EVAL_DEVICE`, else the serving platform's device.

Its own module so that the backends (`hf_whisper`) and the selection function (the package's `__init__`)
both import it without importing each other.
"""

from __future__ import annotations

import os

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

ASR_DEVICE_ENV = "SEED_TTS_EVAL_DEVICE"


def resolve_asr_device(requested: str | None = None) -> str:
    """`requested` (e.g. --asr-device), else `SEED_TTS_EVAL_DEVICE`, else the platform's device, else "cpu"."""
    if requested:
        return requested
    env = os.environ.get(ASR_DEVICE_ENV)
    if env:
        return env
    try:
        from vllm_omni_token2wav import platforms

        platform = platforms.current_omni_platform
        index = platform.current_device_index()
        return platform.device_type if index is None else f"{platform.device_type}:{index}"
    except Exception as exc:  # detection must never stop a CPU scoring run
        logger.warning("platform detection failed (%s); running ASR on cpu", exc)
        return "cpu"
