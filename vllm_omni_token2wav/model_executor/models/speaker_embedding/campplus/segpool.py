# SPDX-License-Identifier: Apache-2.0
"""The two meanings of CAM++'s 100-frame segment pooling, and which one onnxruntime has.

Every CAM layer adds `seg_pool(x)` to its context: `x` [B, C, T'] is averaged over consecutive
100-frame segments (the last one partial unless T' % 100 == 0) and each average is repeated back
over the frames of its segment. In the shipped `campplus.onnx` this is an `AveragePool`
(kernel 100, stride 100, ceil_mode=1, count_include_pad=1), and runtimes disagree on the divisor
of the last, partial window:

| mode       | last partial segment of n < 100 frames | who computes it this way                    |
|------------|----------------------------------------|---------------------------------------------|
| `"legacy"` | sum / 100 (as if zero-padded to 100)   | onnxruntime <= 1.28 (CosyVoice pinned 1.18) |
| `"exact"`  | sum / n                                | PyTorch `avg_pool1d`, onnxruntime >= 1.29   |
| `"auto"`   | whatever the installed onnxruntime does (probed once, see `ort_seg_pool_mode`) |    |

The two agree exactly when ceil(T/2) % 100 == 0 and otherwise differ (cosine 0.998-0.99999 on
the 192-d output). The flow models that consume the embedding were trained on embeddings from
onnxruntime 1.18, i.e. the legacy behaviour.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

SegPoolMode = Literal["legacy", "exact", "auto"]
SEG_POOL_MODES: tuple[str, ...] = ("legacy", "exact", "auto")
SEG_LEN = 100


def check_seg_pool_mode(mode: str) -> str:
    """Return `mode` if it is one of `SEG_POOL_MODES`, else raise a ValueError naming the choices."""
    if mode not in SEG_POOL_MODES:
        raise ValueError(f"seg_pool_mode must be one of {SEG_POOL_MODES}, got {mode!r}")
    return mode


def resolve_seg_pool_mode(mode: str) -> Literal["legacy", "exact"]:
    """Turn `"auto"` into the installed onnxruntime's behaviour; pass `"legacy"`/`"exact"` through."""
    check_seg_pool_mode(mode)
    if mode == "auto":
        return ort_seg_pool_mode()
    return mode  # type: ignore[return-value]


@functools.cache
def ort_seg_pool_mode() -> Literal["legacy", "exact"]:
    """Probe the installed onnxruntime (CPU EP) with a one-node AveragePool graph; cached per process.

    The probe pools 150 ones with kernel/stride 100 and ceil_mode=1: the second window holds 50
    real frames, so legacy runtimes answer 0.5 (divided by the kernel size) and exact ones 1.0.
    Raises RuntimeError if onnxruntime answers anything else (a behaviour this module does not know).
    """
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node(
        "AveragePool", ["x"], ["y"], kernel_shape=[SEG_LEN], strides=[SEG_LEN], ceil_mode=1, count_include_pad=1
    )
    graph = helper.make_graph(
        [node],
        "seg_pool_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 150])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    # opset 11 / IR 6 is readable by every onnxruntime this project supports (>= 1.17).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(),
        sess_options=options,
        providers=["CPUExecutionProvider"],
    )
    (out,) = session.run(None, {"x": np.ones((1, 1, 150), dtype=np.float32)})
    last = float(np.asarray(out).reshape(-1)[-1])
    if abs(last - 0.5) < 1e-6:
        mode: Literal["legacy", "exact"] = "legacy"
    elif abs(last - 1.0) < 1e-6:
        mode = "exact"
    else:
        raise RuntimeError(
            f"onnxruntime {ort.__version__}: AveragePool(ceil_mode=1) probe returned {out!r}; "
            "expected 0.5 (legacy divisor) or 1.0 (exact divisor) for the partial window"
        )
    logger.info("onnxruntime %s pools partial segments the %s way", ort.__version__, mode)
    return mode


def segment_means(x: torch.Tensor, mode: Literal["legacy", "exact"]) -> torch.Tensor:
    """Per-segment means of `x` [B, C, T'] -> [B, C, ceil(T'/100)], the partial segment as `mode` says."""
    frames = x.shape[-1]
    if mode == "exact":
        return F.avg_pool1d(x, kernel_size=SEG_LEN, stride=SEG_LEN, ceil_mode=True)
    pad = (-frames) % SEG_LEN
    if pad:
        x = F.pad(x, (0, pad))
    return F.avg_pool1d(x, kernel_size=SEG_LEN, stride=SEG_LEN)


def seg_pool(x: torch.Tensor, mode: Literal["legacy", "exact"]) -> torch.Tensor:
    """Upstream's `seg_pooling(x, 100, "avg")`: segment means repeated back to frame level, cut to T'."""
    frames = x.shape[-1]
    seg = segment_means(x, mode)
    shape = seg.shape
    seg = seg.unsqueeze(-1).expand(*shape, SEG_LEN).reshape(*shape[:-1], -1)
    return seg[..., :frames]
