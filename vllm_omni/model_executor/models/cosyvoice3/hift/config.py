# SPDX-License-Identifier: Apache-2.0
"""Hyperparameters of CosyVoice3's causal HiFT (`CausalHiFTGenerator`) and its streaming geometry.

Same widths, rates and kernels as the 24 kHz HiFT (`cosyvoice2.hift.HiFTConfig`); what is added
is how far the causal vocoder looks ahead, which fixes when a streamed frame becomes final:

| part                   | reads ahead             | reference                                        |
|------------------------|-------------------------|--------------------------------------------------|
| F0 predictor condnet.0 | 3 mel frames (kernel 4) | `CausalConvRNNF0Predictor`, causal_type 'right'  |
| conv_pre               | 4 mel frames (kernel 5) | `conv_pre_look_right: 4` in cosyvoice3.yaml      |
| iSTFT head             | 1 frame (overlap-add)   | non-final `inference` drops the last 480 samples |

So after N mel frames, the first N - 5 frames of audio are final (`MIN_EMIT_LAG_FRAMES`); the
reference's non-final `inference` cuts the F0 look-ahead off before conv_pre's and returns N - 8
(`REFERENCE_EMIT_LAG_FRAMES`, also minicpmo-utils 1.0.7's "delay 8").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllm_omni.model_executor.models.cosyvoice2.hift.config import FULL_HIFT_CONFIG, HiFTConfig


@dataclass(frozen=True)
class CausalHiFTConfig(HiFTConfig):
    """Shape of a causal HiFT generator; the defaults are Fun-CosyVoice3's (20,779,887 parameters)."""

    conv_pre_look_right: int = 4
    # The fixed noise table covers this many seconds; later samples wrap to its start.
    noise_table_seconds: int = 300

    @property
    def f0_lookahead(self) -> int:
        """Future mel frames one F0 frame reads (condnet.0 has kernel 4)."""
        return 3

    @property
    def noise_table_samples(self) -> int:
        return self.noise_table_seconds * self.sampling_rate

    @property
    def min_emit_lag_frames(self) -> int:
        """Mel frames a stream must hold back: conv_pre's look-ahead plus the iSTFT's overlap frame."""
        return self.conv_pre_look_right + 1

    @property
    def reference_emit_lag_frames(self) -> int:
        """What the reference's non-final `inference` holds back: F0 look-ahead + conv_pre + iSTFT (8)."""
        return self.f0_lookahead + self.conv_pre_look_right + 1


FULL_CAUSAL_HIFT_CONFIG = CausalHiFTConfig(**FULL_HIFT_CONFIG.__dict__)
# Same topology, narrow channels (as REDUCED_HIFT_CONFIG): every key of the real file with a smaller shape.
REDUCED_CAUSAL_HIFT_CONFIG = replace(FULL_CAUSAL_HIFT_CONFIG, base_channels=32, f0_channels=32)

# Facts about the shipped Fun-CosyVoice3 hift.pt (counted on the reference CausalHiFTGenerator).
FULL_CAUSAL_HIFT_NUM_KEYS = 328
FULL_CAUSAL_HIFT_NUM_PARAMS = 20_779_887

# What the reference's non-final inference returns after N frames: (N - 8) * 480 samples.
REFERENCE_EMIT_LAG_FRAMES = FULL_CAUSAL_HIFT_CONFIG.reference_emit_lag_frames
MIN_EMIT_LAG_FRAMES = FULL_CAUSAL_HIFT_CONFIG.min_emit_lag_frames
