# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5's Token2Wav facade: the shared core with MiniCPM-o's streaming variant.

MiniCPM-o ships the Step-Audio2 token2wav assets (the core's layout): `MiniCPMO45Token2WavCore` is the
core under MiniCPM-o's own name (what the stage builds, so its logs and errors say MiniCPM-o), and
`MiniCPMO45Token2wav` is that core built the way upstream builds its facade (positional arguments,
`variant=`), with the device resolved and the asset files checked at construction so errors (missing
directory or file, bad device spec) surface then, not on the first request; the models still load
lazily (first synthesis, or `load()`). It subclasses the core and forwards nothing: every method is
the core's (`token2wav_core/core.py`, whose base `token2wav_core/facade.py` owns the speaker path).
vLLM constructs stage models under `set_default_torch_dtype(bf16/fp16)`; everything built here is
fp32 by explicit dtype, and the process default dtype is never switched (a global switch races with
the concurrent initialisation of other stages).

MiniCPM-o comes in two Token2Wav variants (`variants.MiniCPMOVariant`, table there): vLLM-Omni
0.30's (the default: three silence tokens (4218) as the prompt's lookahead, the conformer cache
trimmed like the estimator cache, HiFT with a cross-fade) and minicpmo-utils 1.0.7's (the prompt's
first 3 tokens, token- and mel-rate conformer layers trimmed apart, the causal vocoder of
`config.yaml` + `hift.pt` streamed bounded, `hift_original.pt` for whole utterances). `variant=`
picks all three rules; `stream_lookahead` / `conformer_trim` override one of them when given.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.variants import MiniCPMOVariant
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import (
    DEFAULT_PROMPT_CACHE_SIZE,
    Token2WavCore,
)
from vllm_omni_token2wav.platforms import DeviceSpec, normalize_device

logger = init_logger(__name__)


def resolve_token2wav_device(device: DeviceSpec) -> torch.device:
    """The facade's device: explicit spec -> platform serving device.

    Upstream's chain is explicit -> platform device type -> cuda -> npu -> cpu; here the platform
    layer already decides between NPU, CUDA and CPU (`vllm_omni_token2wav.platforms.detect`), so the
    platform's serving device ends the chain. `VLLM_OMNI_TOKEN2WAV_PLATFORM` pins it.
    """
    if device is not None:
        return normalize_device(device)
    from vllm_omni_token2wav import platforms

    return platforms.current_omni_platform.torch_device()


class MiniCPMO45Token2WavCore(Token2WavCore):
    """The shared Token2Wav core under MiniCPM-o 4.5's name (the name its logs, errors and stage show)."""


class MiniCPMO45Token2wav(MiniCPMO45Token2WavCore):
    """Token2Wav of MiniCPM-o 4.5 over a Step-Audio2 token2wav directory, built as upstream builds it.

    The core itself (every method is `Token2WavCore`'s) with three differences at construction:
    upstream's positional `(model_path, float16, n_timesteps, device)`; the device resolved and the
    asset files checked at once (`check_assets`: a broken folder fails the caller, nothing is loaded);
    and `variant=`, which picks the stream lookahead, conformer trim and vocoder together
    (`stream_lookahead` / `conformer_trim` override one rule). With the 1.0.7 variant, whole utterances
    are vocoded with `hift_original.pt` (FileNotFoundError naming it when absent).
    """

    def __init__(
        self,
        model_path: str | Path,
        float16: bool = False,
        n_timesteps: int = 10,
        device: DeviceSpec = None,
        *,
        variant: MiniCPMOVariant | str | None = None,
        prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
        ort_intra_op_threads: int = 1,
        spk_seg_pool_mode: str = "legacy",
        speech_tokenizer_backend: str = "auto",
        stream_lookahead: Lookahead | None = None,
        conformer_trim: ConformerTrim | None = None,
        seed: int = 0,
        flow_dtype: torch.dtype | None = None,
    ) -> None:
        self.variant = MiniCPMOVariant.parse(variant)
        super().__init__(
            model_path,
            float16=float16,
            flow_dtype=flow_dtype,
            device=resolve_token2wav_device(device),
            n_timesteps=n_timesteps,
            prompt_cache_size=prompt_cache_size,
            ort_intra_op_threads=ort_intra_op_threads,
            spk_seg_pool_mode=spk_seg_pool_mode,
            speech_tokenizer_backend=speech_tokenizer_backend,
            stream_lookahead=self.variant.lookahead if stream_lookahead is None else stream_lookahead,
            conformer_trim=self.variant.conformer_trim if conformer_trim is None else conformer_trim,
            seed=seed,
            vocoder=self.variant.vocoder,
        )
        # A broken asset directory fails the caller now; nothing is loaded (models load on first use
        # or `load()`), and no ORT session is built, so a stage can still install a device path.
        self.check_assets()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.model_path)!r}, device={self.device}, variant={self.variant.value}, "
            f"spk={self.spk_backend})"
        )
