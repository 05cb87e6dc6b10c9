# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5's two Token2Wav variants as one explicit choice: vLLM-Omni 0.30's and minicpmo-utils 1.0.7's.

Both run the Step-Audio2 flow on the same `flow.yaml` / `flow.pt` and prompt features; they
disagree on how a stream is set up, how its caches are trimmed and what vocodes it (facts checked
in the vLLM-Omni 0.30.0 wheel, `vllm_omni/model_executor/models/minicpmo_4_5/batched_token2wav.py`, and in
minicpmo-utils 1.0.7, `stepaudio2/token2wav.py`):

| rule                       | `VLLM_OMNI_0_30` (default)              | `MINICPMO_UTILS_1_0_7`                   |
|----------------------------|-----------------------------------------|------------------------------------------|
| lookahead at stream set-up | 3 silence tokens (4218)                 | the prompt's first 3 tokens              |
| estimator cache trim       | `[:P]` + `[-100:]`                      | the same                                 |
| conformer cache trim       | `PROMPT_PLUS_TAIL`: the estimator's     | `PER_RATE`: token-rate layers `[:P/2]` + |
|                            | rule on the whole (tiled) tensor        | `[-50:]` re-tiled, mel-rate `[:P]` +     |
|                            |                                         | `[-100:]`                                |
| streaming vocoder          | HiFT (`hift.pt`) over 8 cached + new    | causal HiFT (`config.yaml` + `hift.pt`), |
|                            | frames, 3840-sample Hamming cross-fade  | bounded, no cross-fade                   |
| first audio of a stream    | 960 samples per token                   | 3840 zeros first (unless the first audio |
|                            |                                         | comes with the last chunk)               |
| whole-utterance vocoder    | `hift.pt`                               | `hift_original.pt` (non-causal HiFT)     |
| vocoder noise              | fresh Gaussian (here seeded per request) | the fixed table of `config.yaml`'s seed |
| files                      | the 5 Step-Audio2 files                 | + `config.yaml`, `hift_original.pt`; a   |
|                            |                                         | causal `hift.pt`                         |

(P = prompt mel frames.) Their mels differ by ~1.6-1.9 % rel L2 from the first trimmed chunk on,
and their audio everywhere (other vocoders).

**Default: `VLLM_OMNI_0_30`.** It is what vLLM-Omni serves for MiniCPM-o and what this fork served
before the choice existed, so existing deployments keep their audio; it runs on the asset folder
MiniCPM-o ships for vLLM-Omni (`assets/token2wav`, the Step-Audio2 layout), while the 1.0.7 variant
needs the two extra files and a causal `hift.pt`; and its first audio is not preceded by 160 ms of
silence. Choose `MINICPMO_UTILS_1_0_7` to reproduce MiniCPM-o's own reference code (minicpmo-utils
1.0.7 `Token2wav`) on a directory in its layout: checked equal chunk by chunk by
`tools/check_minicpmo_reference.py`.
"""

from __future__ import annotations

import enum

from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderKind


class MiniCPMOVariant(str, enum.Enum):
    """Which MiniCPM-o Token2Wav behaviour to reproduce (see the module table)."""

    VLLM_OMNI_0_30 = "vllm-omni-0.30"
    MINICPMO_UTILS_1_0_7 = "minicpmo-utils-1.0.7"

    @classmethod
    def parse(cls, value: MiniCPMOVariant | str | None) -> MiniCPMOVariant:
        """An enum member from itself, its value, or None (the default, `VLLM_OMNI_0_30`)."""
        if value is None:
            return DEFAULT_VARIANT
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(v.value) for v in cls)
            raise ValueError(f"unknown MiniCPM-o token2wav variant {value!r}; choose one of {choices}") from None

    @property
    def lookahead(self) -> Lookahead:
        return Lookahead.SILENCE if self is MiniCPMOVariant.VLLM_OMNI_0_30 else Lookahead.PROMPT_HEAD

    @property
    def conformer_trim(self) -> ConformerTrim:
        return ConformerTrim.PROMPT_PLUS_TAIL if self is MiniCPMOVariant.VLLM_OMNI_0_30 else ConformerTrim.PER_RATE

    @property
    def vocoder(self) -> VocoderKind:
        return VocoderKind.HIFT if self is MiniCPMOVariant.VLLM_OMNI_0_30 else VocoderKind.CAUSAL_HIFT


DEFAULT_VARIANT = MiniCPMOVariant.VLLM_OMNI_0_30

__all__ = ["DEFAULT_VARIANT", "MiniCPMOVariant"]
