# SPDX-License-Identifier: Apache-2.0
"""Hyperparameters and fixed constants of the 25 Hz speech tokenizer v2 (`speech_tokenizer_v2_25hz.onnx`).

One place for the numbers the front end, the torch model, the ONNX export/loader and the long-audio
windowing must agree on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160  # 100 mel frames per second
N_MELS = 128
TOKEN_RATE = 25  # tokens per second: two stride-2 convolutions over the 100 Hz mel
CODEBOOK_SIZE = 3**8  # 6561

# Long audio: 30 s windows with 4 s overlap (stride 26 s); 2 s (50 tokens) dropped on each side of a join.
WINDOW_FRAMES = 30 * SAMPLE_RATE // HOP_LENGTH  # 3000
OVERLAP_FRAMES = 4 * SAMPLE_RATE // HOP_LENGTH  # 400
STRIDE_FRAMES = WINDOW_FRAMES - OVERLAP_FRAMES  # 2600
JOIN_DROP_TOKENS = (4 // 2) * TOKEN_RATE  # 50

HEAD_DIM = 64  # fixed by the RoPE tables (precomputed for 64-dim heads)


@dataclass(frozen=True)
class SpeechTokenizerV2Config:
    """Encoder shape; defaults are the shipped model (102 keys, 123,714,568 parameters)."""

    n_mels: int = N_MELS
    n_state: int = 1280
    n_layer: int = 6
    n_mlp: int = 5120
    fsmn_kernel: int = 31
    rope_theta: float = 10000.0
    rope_positions: int = 2048
    fsq_dims: int = 8
    fsq_levels: int = 3

    @property
    def n_head(self) -> int:
        return self.n_state // HEAD_DIM

    def __post_init__(self) -> None:
        if self.n_state % HEAD_DIM:
            raise ValueError(f"speech tokenizer n_state must be a multiple of {HEAD_DIM}, got {self.n_state}")


FULL_TOKENIZER_CONFIG = SpeechTokenizerV2Config()
REDUCED_TOKENIZER_CONFIG = replace(FULL_TOKENIZER_CONFIG, n_state=128, n_layer=2, n_mlp=512)

FULL_TOKENIZER_NUM_KEYS = 102
FULL_TOKENIZER_NUM_PARAMS = 123_714_568


def mel_frames(num_samples: int) -> int:
    """Mel frames of `num_samples` at 16 kHz (centred STFT, last frame dropped)."""
    return num_samples // HOP_LENGTH


def token_length(num_frames: int) -> int:
    """Tokens from `num_frames` mel frames: two k3 s2 p1 convolutions, (L - 1) // 2 + 1 each."""
    return ((num_frames - 1) // 2 + 1 - 1) // 2 + 1
