# SPDX-License-Identifier: Apache-2.0
"""In-tree speech tokenizer v2 (25 Hz, 6561 FSQ codes) of the CosyVoice2 token2wav stage.

`load_speech_tokenizer_from_onnx(path)` maps `speech_tokenizer_v2_25hz.onnx` into a torch model
that runs on the serving device; `select_speech_tokenizer(path, backend=...)` returns a backend
with `tokenize(wav_16k) -> (tokens [1, L], L)` (torch, or the onnxruntime fallback);
`write_standin_speech_tokenizer(...)` exports deterministic stand-ins with the shipped layout.
"""

from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import (
    CODEBOOK_SIZE,
    FULL_TOKENIZER_CONFIG,
    FULL_TOKENIZER_NUM_KEYS,
    FULL_TOKENIZER_NUM_PARAMS,
    REDUCED_TOKENIZER_CONFIG,
    SpeechTokenizerV2Config,
)
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.frontend import LogMelFrontend
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.model import SpeechTokenizerV2
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.onnx_loader import (
    SpeechTokenizerOnnxError,
    load_speech_tokenizer_from_onnx,
)
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.standin import (
    cached_standin_speech_tokenizer,
    write_standin_speech_tokenizer,
)
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.tokenizer import (
    OrtSpeechTokenizer,
    SpeechTokenizerBackend,
    TorchSpeechTokenizer,
    select_speech_tokenizer,
)

__all__ = [
    "CODEBOOK_SIZE",
    "FULL_TOKENIZER_CONFIG",
    "FULL_TOKENIZER_NUM_KEYS",
    "FULL_TOKENIZER_NUM_PARAMS",
    "REDUCED_TOKENIZER_CONFIG",
    "LogMelFrontend",
    "OrtSpeechTokenizer",
    "SpeechTokenizerBackend",
    "SpeechTokenizerOnnxError",
    "SpeechTokenizerV2",
    "SpeechTokenizerV2Config",
    "TorchSpeechTokenizer",
    "cached_standin_speech_tokenizer",
    "load_speech_tokenizer_from_onnx",
    "select_speech_tokenizer",
    "write_standin_speech_tokenizer",
]
