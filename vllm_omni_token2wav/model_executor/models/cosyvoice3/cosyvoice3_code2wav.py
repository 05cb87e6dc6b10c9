# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's code2wav stage as vLLM-Omni's runner drives it: `CosyVoice3Code2Wav(*, vllm_config, prefix)`.

vLLM-Omni 0.30 runs CosyVoice3 as talker -> code2wav. Its registry maps only the architecture
`CosyVoice3Model`, one class for both stages that dispatches on `model_config.model_stage`
("cosyvoice3_code2wav" builds its inner `CosyVoice3Code2Wav` module). This class keeps that name for
the code2wav stage alone, on the shared Token2Wav stage (`token2wav_stage/`, design in
docs/design/token2wav_stage.md): any number of requests per step, a stream per request id, failures
isolated per request, the flow batched across requests. What is CosyVoice3's (`family.COSYVOICE3`):

| the talker sends (`talker2code2wav_async_chunk`)       | the stage reads                                   |
|--------------------------------------------------------|---------------------------------------------------|
| `codes.audio`: ids `[0, offset + hop + 3)` (the whole  | `tokens[left_context_size:]`: the 3 lookahead ids |
| prefix), `meta.left_context_size` = offset            | again + the new ones (checked against the stream) |
| `meta.stream_finished` / `meta.finished`               | the last chunk / a token-less terminal chunk      |
| `embed.{speech_token, speech_feat, embedding,          | the voice, with the first chunk                   |
| speech_token_len}` once                                |                                                   |
| sync mode: ids in `input_ids`, `embed.*`, no stream    | a whole utterance (full attention)                |
| meta                                                   |                                                   |

A step maps to the streaming API like this: each segment's new ids go to `flow.stream_chunks` (all
rows of the step in one launch) and the resulting mel to the causal HiFT (`COSYVOICE3_STREAM`), so a
chunk costs the same at every position (upstream re-runs the flow over the prefix and the vocoder
over all mel so far). Chunks with the `chunk_seq` / `cache_epoch` meta of the other families work as
well, as windows that re-send the 3 lookahead ids.

Options beyond the shared ones (`options.py`): `token2wav_batch_vocoder` (rows at equal positions
share a vocoder launch), `token2wav_final_chunk` ("full_attention" default: upstream's last call
exactly, one full re-run per utterance; or "block_causal": constant cost, differs in the last chunk).
`token2wav_device_graphs` (true / false / auto, as for the other families) replays the flow's DiT
segments and the causal HiFT's steady-chunk decoder from device graphs (`cosyvoice3/graphs.py`).
`ref_audio_max_seconds` does not apply: CosyVoice3
prompts are used as sent (aligned to their tokens, at most 30 s). The default voice is
`default_voice.wav` with its prompt tokens in `default_voice.tokens` (or `$COSYVOICE3_DEFAULT_PROMPT_WAV`
and the `.tokens` file beside it, or the `prompt_wav` option).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import FinalChunk
from vllm_omni_token2wav.model_executor.models.cosyvoice3.backend import CosyVoice3Backend
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
from vllm_omni_token2wav.model_executor.models.cosyvoice3.family import COSYVOICE3
from vllm_omni_token2wav.model_executor.models.cosyvoice3.graphs import CosyVoice3GraphSettings
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import read_prompt_tokens, voice_tokens_path
from vllm_omni_token2wav.model_executor.models.cosyvoice3.voice import ReferenceVoice
from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import Token2WavBackend
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec, find_default_voice
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import StageOptions
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel


def _as_sent(source: object, seconds: float) -> object:
    """CosyVoice3 voices reach the backend as sent: no fixed-length normalisation (tokens must stay aligned)."""
    del seconds
    return source


class CosyVoice3Code2Wav(Token2WavStageModel):
    """CosyVoice3's code2wav stage (see the module docstring)."""

    family: ClassVar[FamilySpec] = COSYVOICE3
    token2wav: CosyVoice3Token2Wav

    def _build_core(self, folder: Path, opts: StageOptions) -> CosyVoice3Token2Wav:
        self.check_no_variant(opts)  # CosyVoice3 has no token2wav variants
        return CosyVoice3Token2Wav(
            folder,
            flow_dtype=opts.flow_dtype,
            device=opts.device,
            n_timesteps=opts.n_timesteps,
            seed=opts.seed,
            final_chunk=FinalChunk(opts.final_chunk),
            **({} if opts.prompt_cache_size is None else {"prompt_cache_size": opts.prompt_cache_size}),
        )

    def _build_backend(self, opts: StageOptions) -> Token2WavBackend:
        graphs = None
        if opts.device_graphs is not False:  # None: auto (environment and platform); True: on
            graphs = CosyVoice3GraphSettings(enabled=opts.device_graphs, graph_api=opts.device_graph_api)
        return CosyVoice3Backend(
            self.token2wav, batch_vocoder=opts.batch_vocoder, kv_cache_dtype=opts.kv_cache_dtype, graphs=graphs
        )

    def _voice_loader(self) -> Callable[[object, float], object] | None:
        return _as_sent

    def _default_voice(self, opts: StageOptions, folder: Path) -> Any:
        """The default voice: a clip and its prompt tokens (`<clip>.tokens`), read once here."""
        override = opts.prompt_wav
        if override is not None and not isinstance(override, str | Path):
            raise ValueError(
                "CosyVoice3 stage: the prompt_wav option must be a file path with its speech tokens in "
                "<file>.tokens beside it (the stage cannot tokenise audio)"
            )
        path = find_default_voice(
            self.family, self.model_folder(folder), folder, None if override is None else str(override)
        )
        tokens_file = voice_tokens_path(path)
        if not tokens_file.is_file():
            raise FileNotFoundError(
                f"CosyVoice3 stage: the default voice {path} needs its prompt speech tokens in {tokens_file} "
                "(ids separated by spaces; CosyVoice's front end or the talker's embed.speech_token gives them)"
            )
        return ReferenceVoice(str(path), read_prompt_tokens(tokens_file))


__all__ = ["CosyVoice3Code2Wav"]
