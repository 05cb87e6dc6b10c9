# SPDX-License-Identifier: Apache-2.0
"""The toy family's stage class: the shared-core stage with the toy's `FamilySpec` (tests only)."""

from __future__ import annotations

from typing import ClassVar

from tests.plugins.toy_family.family import TOY_TOKEN2WAV
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.stage import CoreStageModel
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec


class ToyToken2Wav(CoreStageModel):
    """A fourth family served by the shared Token2Wav core, unchanged."""

    family: ClassVar[FamilySpec] = TOY_TOKEN2WAV
    core_class: ClassVar[type[Token2WavCore]] = Token2WavCore


__all__ = ["ToyToken2Wav"]
