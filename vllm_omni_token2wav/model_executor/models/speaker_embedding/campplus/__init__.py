# SPDX-License-Identifier: Apache-2.0
"""In-tree CAM++ speaker encoder (the network inside CosyVoice's `campplus.onnx`).

`CAMPPlus` keeps upstream's module tree and state_dict keys; `ort_seg_pool_mode()` tells which
segment-pooling semantics the installed onnxruntime has (see `segpool`). The ONNX -> torch weight
import is `onnx_import.py` (`load_campplus_onnx`), used by the device backend
`speaker_embedding/torch_backend.py`; deterministic stand-in `campplus.onnx` files come from `standin.py`.
"""

from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.dtdnn import CAMPPlus
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import (
    SEG_POOL_MODES,
    SegPoolMode,
    ort_seg_pool_mode,
    resolve_seg_pool_mode,
)

__all__ = ["CAMPPlus", "SEG_POOL_MODES", "SegPoolMode", "ort_seg_pool_mode", "resolve_seg_pool_mode"]
