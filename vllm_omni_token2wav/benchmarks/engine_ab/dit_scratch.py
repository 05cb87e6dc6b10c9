# SPDX-License-Identifier: Apache-2.0
"""Scratch buffers of upstream's Step-Audio2 streaming flow sized from the model, for the upstream arm only.

The flow that upstream's Step-Audio2 token2wav streams with (Step-Audio2's `cosyvoice2.flow`;
`stepaudio2-minicpmo` ships the same files) writes every block's new caches into buffers registered with
hard-coded full-size shapes: the DiT's `att_cache_buffer` (16, 2, 8, 1000, 128) and `cnn_cache_buffer`
(16, 2, 1024, 2), i.e. depth 16, 8 heads of 64, hidden 512 (the conv cache holds both causal convs' inputs,
2 x hidden), and the CFM's per-Euler-step copies of them (16 steps first). A flow built from a reduced
`flow.yaml` (our stand-in: depth 2, 2 heads of 32, hidden 64) then fails on its first streamed chunk
(`The expanded size of the tensor (1024) must match the existing size (128)`), while the whole-utterance
path, which uses no such buffer, runs.

`bench engine-ab --route stream` serves upstream's class behind our stand-in producer on the reduced folder,
so the upstream arm's `cosyvoice2` shim (`upstream_path/cosyvoice2`) calls `size_scratch_from_model` once:
after upstream's `__init__`, the buffers are re-registered with the shapes `scratch_shapes` derives from the
DiT constructor's own arguments (the CFM's: 16 steps of its estimator's). Nothing else changes: the buffers
are non-persistent scratch (not in `flow.pt`), their contents are written before they are read, and at the
full size the derived shapes are the hard-coded ones (`FULL_SIZE`; tests/benchmarks/engine_ab/
test_dit_scratch.py checks both), so upstream's arithmetic and its real-checkpoint behaviour are untouched.
The engine-ab report states that this was applied.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Final

#: The estimator upstream's buffer shapes were written for (Step-Audio2 / CosyVoice2 `flow.yaml`).
FULL_SIZE: Final = {"depth": 16, "num_heads": 8, "head_dim": 64, "hidden_size": 512}
CFG_ROWS: Final = 2  # conditional + unconditional row of classifier-free guidance
MAX_CACHE_FRAMES: Final = 1000  # upstream's attention-cache length (mel frames), kept
CONV_CACHE_FRAMES: Final = 2  # kernel 3 causal convs keep 2 frames
MAX_EULER_STEPS: Final = 16  # the CFM keeps one cache per Euler step, for at most this many
PATCHED_FLAG: Final = "_token2wav_scratch_from_model"


def scratch_shapes(
    depth: int, num_heads: int, head_dim: int, hidden_size: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(`att_cache_buffer`, `cnn_cache_buffer`) shapes for an estimator of this size."""
    att = (depth, CFG_ROWS, num_heads, MAX_CACHE_FRAMES, 2 * head_dim)  # keys and values side by side
    cnn = (depth, CFG_ROWS, 2 * hidden_size, CONV_CACHE_FRAMES)  # both causal convs' inputs
    return att, cnn


def _reregister(module: Any, name: str, shape: tuple[int, ...]) -> None:
    import torch

    old = getattr(module, name)
    if tuple(old.shape) != shape:
        module.register_buffer(name, torch.zeros(shape, dtype=old.dtype, device=old.device), persistent=False)


def _wrap_init(cls: type, after: Any) -> bool:
    if cls.__dict__.get(PATCHED_FLAG, False):
        return False
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - replaces the class's own
        original(self, *args, **kwargs)
        after(self, *args, **kwargs)

    cls.__init__ = __init__
    setattr(cls, PATCHED_FLAG, True)
    return True


def size_scratch_from_model(dit_cls: type, cfm_cls: type) -> bool:
    """Wrap both classes' `__init__` so their scratch buffers follow the model's sizes; False if already done."""
    signature = inspect.signature(dit_cls.__init__)

    def size_dit(dit: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(dit, *args, **kwargs)
        bound.apply_defaults()
        att, cnn = scratch_shapes(**{name: int(bound.arguments[name]) for name in FULL_SIZE})
        _reregister(dit, "att_cache_buffer", att)
        _reregister(dit, "cnn_cache_buffer", cnn)

    def size_cfm(cfm: Any, *args: Any, **kwargs: Any) -> None:
        estimator = cfm.estimator
        _reregister(cfm, "att_cache_buffer", (MAX_EULER_STEPS, *estimator.att_cache_buffer.shape))
        _reregister(cfm, "cnn_cache_buffer", (MAX_EULER_STEPS, *estimator.cnn_cache_buffer.shape))

    patched_dit = _wrap_init(dit_cls, size_dit)
    patched_cfm = _wrap_init(cfm_cls, size_cfm)
    return patched_dit or patched_cfm


__all__ = [
    "CFG_ROWS",
    "FULL_SIZE",
    "MAX_CACHE_FRAMES",
    "MAX_EULER_STEPS",
    "scratch_shapes",
    "size_scratch_from_model",
]
