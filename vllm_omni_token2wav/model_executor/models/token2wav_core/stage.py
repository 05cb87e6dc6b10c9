# SPDX-License-Identifier: Apache-2.0
"""The serving stage over the shared Token2Wav core: what MiniCPM-o 4.5 and Step-Audio2 have in common.

Both families run the CosyVoice2 flow + HiFT of a token2wav asset folder, so their stage classes
differ only in their `FamilySpec` (and MiniCPM-o in its vocoder variants). `CoreStageModel` builds
the core (`Token2WavCore`, or the family's facade class `core_class`) and the batched backend over it
(`stage_backend.CosyVoice2Backend`) for the family-agnostic stage (`token2wav_stage/stage_model.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.stage_backend import CosyVoice2Backend, GraphSettings
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderKind
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import StageOptions
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel


class CoreStageModel(Token2WavStageModel):
    """A Token2Wav stage over the shared core and its CosyVoice2 flow + HiFT backend."""

    #: The facade class the stage builds (a family's own name for the core, e.g. StepAudio2Token2WavCore).
    core_class: ClassVar[type[Token2WavCore]] = Token2WavCore
    token2wav: Token2WavCore

    def _build_core(self, folder: Path, opts: StageOptions) -> Token2WavCore:
        """The Token2Wav core over the asset folder (models stay unloaded until `load_weights`)."""
        lookahead, conformer_trim, vocoder = self.stream_rules(opts)
        return self.core_class(
            folder,
            flow_dtype=opts.flow_dtype,
            device=opts.device,
            n_timesteps=opts.n_timesteps,
            stream_lookahead=lookahead,
            conformer_trim=conformer_trim,
            stream_setup_cache_size=opts.setup_cache_size,
            seed=opts.seed,
            kv_cache_dtype=opts.kv_cache_dtype,
            vocoder=vocoder,
            **({} if opts.prompt_cache_size is None else {"prompt_cache_size": opts.prompt_cache_size}),
        )

    def _build_backend(self, opts: StageOptions) -> CosyVoice2Backend:
        graphs = None
        if opts.device_graphs is not False:
            graphs = GraphSettings(max_rows=opts.max_rows, enabled=opts.device_graphs, graph_api=opts.device_graph_api)
        return CosyVoice2Backend(self.token2wav, graphs, equal_vocoder_shapes=opts.pad_to_buckets)

    def stream_rules(self, opts: StageOptions) -> tuple[Lookahead, ConformerTrim, VocoderKind]:
        """Stream set-up lookahead, conformer trim and vocoder: the family's (MiniCPM-o: its `variant`)."""
        self.check_no_variant(opts)
        return self.family.lookahead, self.family.conformer_trim, VocoderKind.HIFT


__all__ = ["CoreStageModel"]
