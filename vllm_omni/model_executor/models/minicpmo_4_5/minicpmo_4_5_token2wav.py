# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5's Token2Wav facade: the Step-Audio2 core, resolved to a device and prepared eagerly.

MiniCPM-o ships the Step-Audio2 token2wav assets and wraps the core so that construction errors
(missing directory or file, bad device spec) surface when the stage starts, not on the first
request. vLLM constructs stage models under `set_default_torch_dtype(bf16/fp16)`; everything this
facade builds is fp32 by explicit dtype, and the process default dtype is never switched (a global
switch races with the concurrent initialisation of other stages).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vllm_omni.logger import init_logger
from vllm_omni.model_executor.models.cosyvoice3.speaker_embedding import SpeakerEmbeddingBackend
from vllm_omni.model_executor.models.step_audio2.prompt_features import PromptFeatures
from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import (
    DEFAULT_PROMPT_CACHE_SIZE,
    PromptWav,
    StepAudio2Token2WavCore,
)
from vllm_omni.platforms import DeviceSpec, normalize_device

logger = init_logger(__name__)


def resolve_token2wav_device(device: DeviceSpec) -> torch.device:
    """The facade's device: explicit spec -> platform serving device.

    Upstream's chain is explicit -> platform device type -> cuda -> npu -> cpu; here the platform
    layer already decides between NPU, CUDA and CPU (`vllm_omni.platforms.detect`), so the
    platform's serving device ends the chain. `VLLM_OMNI_PLATFORM` pins it.
    """
    if device is not None:
        return normalize_device(device)
    from vllm_omni import platforms

    return platforms.current_omni_platform.torch_device()


class MiniCPMO45Token2wav:
    """Token2Wav of MiniCPM-o 4.5 over a Step-Audio2 token2wav directory (prompt path only for now)."""

    def __init__(
        self,
        model_path: str | Path,
        float16: bool = False,
        n_timesteps: int = 10,
        device: DeviceSpec = None,
        *,
        prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
        ort_intra_op_threads: int = 1,
        spk_seg_pool_mode: str = "legacy",
    ) -> None:
        self.device = resolve_token2wav_device(device)
        self.core = StepAudio2Token2WavCore(
            model_path,
            float16=float16,
            device=self.device,
            n_timesteps=n_timesteps,
            prompt_cache_size=prompt_cache_size,
            ort_intra_op_threads=ort_intra_op_threads,
            spk_seg_pool_mode=spk_seg_pool_mode,
        )
        # Eager, so a broken asset directory fails the stage start. Loads fp32 only, by explicit
        # dtype; leaves the ORT session unbuilt so the stage can still install a device path.
        self.core._ensure_models_loaded()

    @property
    def spk_backend(self) -> str:
        return self.core.spk_backend

    @property
    def spk_model(self) -> SpeakerEmbeddingBackend:
        return self.core.spk_model

    def enable_device_spk_embedding(self) -> str:
        return self.core.enable_device_spk_embedding()

    def enable_trt_spk_embedding(self) -> str:
        return self.core.enable_trt_spk_embedding()

    def prepare_prompt(self, prompt_wav: PromptWav) -> PromptFeatures:
        return self.core.prepare_prompt(prompt_wav)

    def speaker_embedding(self, prompt_wav: PromptWav) -> torch.Tensor:
        return self.core.speaker_embedding(prompt_wav)

    def __repr__(self) -> str:
        return f"MiniCPMO45Token2wav({str(self.core.model_path)!r}, device={self.device}, spk={self.spk_backend})"
