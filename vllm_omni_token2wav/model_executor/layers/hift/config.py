# SPDX-License-Identifier: Apache-2.0
"""Hyperparameters of the 24 kHz HiFT vocoder shipped as `hift.pt` in CosyVoice2 token2wav directories.

Kept apart from the modules so the loader, the stand-in generator and the tests agree on one
definition of "full size" and "reduced" without building a network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class HiFTConfig:
    """Shape of a HiFT generator; the defaults are the shipped 24 kHz model (20,821,295 parameters).

    Only the channel widths are free in the stand-ins: the upsampling chain (8 x 5 x 3 x iSTFT hop 4
    = 480 samples per mel frame) is what makes the vocoder match the flow model's 50 Hz mel rate.
    """

    in_channels: int = 80
    base_channels: int = 512
    f0_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = field(default=((1, 3, 5), (1, 3, 5), (1, 3, 5)))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = field(default=((1, 3, 5), (1, 3, 5), (1, 3, 5)))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_layers: int = 5

    @property
    def upsample_scale(self) -> int:
        """Waveform samples per mel frame (480 for the shipped model)."""
        return math.prod(self.upsample_rates) * self.istft_hop

    @property
    def stft_channels(self) -> int:
        """Real + imaginary STFT bins of the source signal (n_fft + 2 = 18)."""
        return self.istft_n_fft + 2

    def stage_channels(self, stage: int) -> int:
        return self.base_channels // (2 ** (stage + 1))


FULL_HIFT_CONFIG = HiFTConfig()
# Same topology, narrow channels: every key of the real file exists with a smaller shape, so the
# loader, weight-norm handling and output length are exercised in milliseconds.
REDUCED_HIFT_CONFIG = replace(FULL_HIFT_CONFIG, base_channels=32, f0_channels=32)

# Facts about the shipped file, checked by the tests at full size.
FULL_HIFT_NUM_KEYS = 328
FULL_HIFT_NUM_PARAMS = 20_821_295
