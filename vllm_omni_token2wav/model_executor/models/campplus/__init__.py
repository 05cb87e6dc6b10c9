# SPDX-License-Identifier: Apache-2.0
"""In-tree CAM++ speaker encoder (the network inside CosyVoice's `campplus.onnx`).

`CAMPPlus` keeps upstream's module tree and state_dict keys; `ort_seg_pool_mode()` tells which
segment-pooling semantics the installed onnxruntime has (see `segpool`). The ONNX -> torch loader
lives in `vllm_omni_token2wav.model_executor.models.cosyvoice3.speaker_embedding_torch`; deterministic
stand-in `campplus.onnx` files come from `campplus.standin`.
"""

from vllm_omni_token2wav.model_executor.models.campplus.dtdnn import CAMPPlus
from vllm_omni_token2wav.model_executor.models.campplus.segpool import (
    SEG_POOL_MODES,
    SegPoolMode,
    ort_seg_pool_mode,
    resolve_seg_pool_mode,
)

__all__ = ["CAMPPlus", "SEG_POOL_MODES", "SegPoolMode", "ort_seg_pool_mode", "resolve_seg_pool_mode"]
