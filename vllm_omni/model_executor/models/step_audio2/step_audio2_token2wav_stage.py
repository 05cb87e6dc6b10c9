# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2's Token2Wav as a vLLM-Omni stage model: token ids in, 24 kHz audio out.

vLLM-Omni runs Step-Audio2 as two stages: the thinker emits audio tokens, and this stage turns them
into a waveform in the voice of a prompt clip. The runner constructs stage models with
`(*, vllm_config, prefix)` under a bf16/fp16 default dtype, calls `load_weights(...)` once, then
`forward(input_ids, positions, ...)` per request; audio goes back in `multimodal_outputs`.

What this wrapper adds to `StepAudio2Token2WavCore`:
- where the assets are: `model_path=` wins, else `hf_config.token2wav_path`, else
  `<model>/token2wav`; the device: `device=`, else `vllm_config.device_config.device`, else the
  platform's serving device;
- laziness: `__init__` validates the directory and, on Ascend, installs the device speaker
  embedding (failure fails the stage rather than silently keeping the host-blocking CPU session);
  models load in `load_weights` (the token2wav files are not part of the LLM checkpoint, so the
  weights iterable is drained and nothing of it is used) or on the first request;
- nothing imports vLLM: the wrapper reads the config by attribute and runs without vLLM installed.

Unlike the upstream wrapper, a short or all-zero `input_ids` is synthesised like any other input:
treating "< 50 tokens or all zeros" as a profiling run silently returned silence for short replies.
Profiling runs pass `dummy_run=True` and get empty audio.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vllm_omni.logger import init_logger
from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import PromptWav, StepAudio2Token2WavCore
from vllm_omni.platforms import DeviceSpec

logger = init_logger(__name__)


@dataclass
class Token2WavStageOutput:
    """What the stage returns per forward: audio in `multimodal_outputs["model_outputs"]` (float32 [N], 24 kHz)."""

    text_hidden_states: torch.Tensor | None = None
    multimodal_outputs: dict[str, torch.Tensor] = field(default_factory=dict)


def _config_attr(vllm_config: Any, *path: str) -> Any:
    value = vllm_config
    for name in path:
        value = getattr(value, name, None)
        if value is None:
            return None
    return value


class StepAudio2Token2WavForConditionalGeneration(nn.Module):
    """vLLM-style stage model over a Step-Audio2 token2wav directory (see the module docstring)."""

    #: Tells the vLLM-Omni runner to read `multimodal_outputs` from `forward`'s result.
    have_multimodal_outputs = True

    def __init__(
        self,
        *,
        vllm_config: Any = None,
        prefix: str = "",
        model_path: str | Path | None = None,
        device: DeviceSpec = None,
        float16: bool | None = None,
        n_timesteps: int = 10,
        prompt_wav: PromptWav | None = None,
    ) -> None:
        super().__init__()
        from vllm_omni import platforms

        self.prefix = prefix
        path = model_path or _config_attr(vllm_config, "model_config", "hf_config", "token2wav_path")
        if path is None:
            model = _config_attr(vllm_config, "model_config", "model")
            if model is None:
                raise ValueError(
                    "StepAudio2Token2WavForConditionalGeneration needs model_path=, hf_config.token2wav_path "
                    "or model_config.model (whose token2wav/ folder holds the assets)"
                )
            path = Path(model) / "token2wav"
        if device is None:
            device = _config_attr(vllm_config, "device_config", "device")
        if float16 is None:
            float16 = bool(_config_attr(vllm_config, "model_config", "hf_config", "token2wav_float16") or False)
        self.default_prompt_wav = prompt_wav
        self.token2wav = StepAudio2Token2WavCore(path, float16=float16, device=device, n_timesteps=n_timesteps)
        self.token2wav.check_assets()
        if platforms.current_omni_platform.is_npu():
            name = self.token2wav.enable_device_spk_embedding()
            logger.info("token2wav stage: NPU platform, speaker embedding on the device (%s)", name)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the token2wav models from their directory; `weights` (LLM checkpoint) is drained unused."""
        for _ in weights:
            pass
        self.token2wav._ensure_models_loaded()
        return set()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        prompt_wav: PromptWav | None = None,
        dummy_run: bool = False,
        **kwargs: Any,
    ) -> Token2WavStageOutput:
        """Audio of the speech tokens `input_ids` ([T] or [1, T]) in the voice of `prompt_wav`."""
        if dummy_run:
            empty = torch.zeros(0, dtype=torch.float32, device=self.token2wav.device)
            return Token2WavStageOutput(multimodal_outputs={"model_outputs": empty})
        prompt = prompt_wav if prompt_wav is not None else self.default_prompt_wav
        if prompt is None:
            raise ValueError("token2wav stage: no prompt_wav for this request and no default prompt_wav configured")
        audio = self.token2wav(input_ids, prompt)
        return Token2WavStageOutput(multimodal_outputs={"model_outputs": audio.reshape(-1)})


__all__ = ["StepAudio2Token2WavForConditionalGeneration", "Token2WavStageOutput"]
