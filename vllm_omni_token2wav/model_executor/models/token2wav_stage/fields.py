# SPDX-License-Identifier: Apache-2.0
"""Reading one field of a segment's dict, however the runner wrapped or flattened it.

`meta.*` may arrive nested under `meta`, flattened as `meta.<key>` or top-level (a request without a
producer); `codes.*` nested or flattened; values as Python scalars, one-element lists or 0-d /
1-element tensors. The adapter (`contract.py`) and the voice readers (`voice.py`, a family's own
reader such as `cosyvoice3/voice.py`) read fields through these three functions and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def scalar(value: Any, default: Any = None) -> Any:
    """A Python scalar from a value the runner may wrap (0-d / 1-element tensor, 1-element list)."""
    if isinstance(value, torch.Tensor):
        return value.reshape(-1)[0].item() if value.numel() else default
    if isinstance(value, np.ndarray):
        return value.reshape(-1)[0].item() if value.size else default
    if isinstance(value, list | tuple):
        return scalar(value[0], default) if value else default
    return default if value is None else value


def meta_value(info: Mapping[str, Any], key: str) -> Any:
    """`meta[key]` whether nested (`info["meta"][key]`), flattened (`info["meta.key"]`) or top-level (`info[key]`)."""
    meta = info.get("meta")
    if isinstance(meta, Mapping) and meta.get(key) is not None:
        return meta[key]
    flat = info.get(f"meta.{key}")
    if flat is not None:
        return flat
    return info.get(key)


def codes_value(info: Mapping[str, Any], key: str) -> Any:
    """`codes[key]` whether nested (`info["codes"][key]`) or flattened (`info["codes.key"]`)."""
    codes = info.get("codes")
    if isinstance(codes, Mapping) and codes.get(key) is not None:
        return codes[key]
    return info.get(f"codes.{key}")


__all__ = ["codes_value", "meta_value", "scalar"]
