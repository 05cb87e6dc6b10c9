# SPDX-License-Identifier: Apache-2.0
"""Load a shipped `hift.pt` into the in-tree `HiFTGenerator` (or the causal one), strictly.

`hift.pt` is a plain state_dict whose 82 weight-normalised convolutions appear in one of two
spellings, depending on the torch version that saved it:

| scheme | keys per weight-normed module                                      | saved by                      |
|--------|--------------------------------------------------------------------|-------------------------------|
| old    | `X.weight_g`, `X.weight_v`                                         | `torch.nn.utils.weight_norm`  |
| new    | `X.parametrizations.weight.original0`, `...original1` (g, v)       | `nn.utils.parametrizations`   |

and every key may carry a leading `generator.` (files cut from a training checkpoint). Both are
normalised to the new spelling, then the key set must equal the model's exactly (328 keys at full
size) and every shape must match; anything else is an error naming the keys, never a partial load.

Weight norm (dim 0, w = g * v / ||v|| over all dims but 0) is folded into `weight` once at load
with `torch._weight_norm`, the kernel torch's parametrisation itself calls on every forward, so the
folded model's output is bit-identical to the unfolded one (`fold_weight_norm=False` keeps torch's
parametrisation installed, for that comparison and for fine-tuning). Each module is folded in
its own dtype: CosyVoice3's causal HiFT keeps its F0 predictor in float64, as the reference does
after `f0_predictor.to(torch.float64)`, so g and v are widened first and the fold runs in float64.

Both vocoders store the same 328 key names; they differ in shapes (conv_pre kernel 7 vs 5,
ConvTranspose vs Conv1d ups, F0 kernel 3 vs 4). `read_hift_checkpoint` tells which one a file
holds from conv_pre's kernel, so loading one into the other names the mix-up instead of listing
shape mismatches.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.hift.config import FULL_HIFT_CONFIG, HiFTConfig
from vllm_omni_token2wav.model_executor.layers.hift.generator import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift.layers import HiFTBase
from vllm_omni_token2wav.platforms import DeviceSpec, normalize_device

logger = init_logger(__name__)

PREFIX = "generator."
_NEW_G = ".parametrizations.weight.original0"
_NEW_V = ".parametrizations.weight.original1"
_OLD_G = ".weight_g"
_OLD_V = ".weight_v"
# conv_pre's kernel tells the two vocoders apart (both files have the same 328 key names).
HIFT_CONV_PRE_KERNEL = 7
CAUSAL_HIFT_CONV_PRE_KERNEL = 5
_VOCODER_BY_KERNEL = {
    HIFT_CONV_PRE_KERNEL: "the non-causal HiFT (CosyVoice2 / Step-Audio2 hift.pt, MiniCPM-o hift_original.pt)",
    CAUSAL_HIFT_CONV_PRE_KERNEL: "CosyVoice3's causal HiFT (Fun-CosyVoice3 hift.pt, MiniCPM-o causal hift.pt)",
}

ModelT = TypeVar("ModelT", bound=HiFTBase)


class HiFTLoadError(ValueError):
    """hift.pt does not match the in-tree HiFT (missing / unexpected keys, wrong shapes, not a state_dict)."""


def _short_list(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def normalize_hift_keys(state_dict: dict[str, torch.Tensor], source: str = "hift.pt") -> dict[str, torch.Tensor]:
    """Strip a leading `generator.` (all keys or none) and rename old weight-norm keys to the new scheme."""
    prefixed = [k for k in state_dict if k.startswith(PREFIX)]
    if prefixed and len(prefixed) != len(state_dict):
        plain = [k for k in state_dict if not k.startswith(PREFIX)]
        raise HiFTLoadError(
            f"{source}: {len(prefixed)} keys start with {PREFIX!r} but {len(plain)} do not ({_short_list(plain, 5)}); "
            "expected all or none to carry the prefix"
        )
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        name = key[len(PREFIX) :] if prefixed else key
        if name.endswith(_OLD_G):
            name = name[: -len(_OLD_G)] + _NEW_G
        elif name.endswith(_OLD_V):
            name = name[: -len(_OLD_V)] + _NEW_V
        if name in out:
            raise HiFTLoadError(f"{source}: key {key!r} duplicates {name!r} (both weight-norm schemes present)")
        out[name] = value
    return out


def expected_hift_shapes(model: HiFTBase) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a hift.pt (new weight-norm scheme) for `model`'s config."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, _ in model.weight_norm_modules():
        weight_shape = shapes.pop(f"{name}.weight")
        shapes[name + _NEW_G] = (weight_shape[0],) + (1,) * (len(weight_shape) - 1)
        shapes[name + _NEW_V] = weight_shape
    return shapes


def infer_hift_config(
    state_dict: dict[str, torch.Tensor],
    source: str = "hift.pt",
    *,
    base: HiFTConfig = FULL_HIFT_CONFIG,
    conv_pre_kernel: int = HIFT_CONV_PRE_KERNEL,
) -> HiFTConfig:
    """`base` with the channel widths of the tensors (everything else is fixed by the 24 kHz topology).

    `conv_pre_kernel` is the kernel the caller's vocoder has; a file with the other vocoder's
    kernel is rejected with both names.
    """
    probes = {"conv_pre" + _NEW_V: 3, "f0_predictor.condnet.0" + _NEW_V: 3}
    missing = [k for k in probes if k not in state_dict]
    if missing:
        raise HiFTLoadError(
            f"{source}: no {', '.join(missing)}; this is not a HiFT vocoder state_dict "
            f"(first keys: {_short_list(sorted(state_dict), 5)})"
        )
    for key, rank in probes.items():
        if state_dict[key].dim() != rank:
            raise HiFTLoadError(f"{source}: {key!r} has shape {tuple(state_dict[key].shape)}, expected rank {rank}")
    kernel = int(state_dict["conv_pre" + _NEW_V].shape[2])
    if kernel != conv_pre_kernel:
        held = _VOCODER_BY_KERNEL.get(kernel, f"an unknown vocoder (conv_pre kernel {kernel})")
        raise HiFTLoadError(
            f"{source}: conv_pre kernel is {kernel}, expected {conv_pre_kernel}: the file holds {held}, "
            f"but it is being loaded as {_VOCODER_BY_KERNEL.get(conv_pre_kernel, 'another vocoder')}; "
            "use the other loader (load_hift / load_causal_hift) or the other file"
        )
    base_channels = int(state_dict["conv_pre" + _NEW_V].shape[0])
    f0_channels = int(state_dict["f0_predictor.condnet.0" + _NEW_V].shape[0])
    if base_channels % 8:
        raise HiFTLoadError(f"{source}: conv_pre has {base_channels} output channels; HiFT needs a multiple of 8")
    return dataclasses.replace(base, base_channels=base_channels, f0_channels=f0_channels)


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"hift.pt not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise HiFTLoadError(f"{path}: cannot be read as a torch state_dict ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        kind = type(obj).__name__ if not isinstance(obj, dict) else "dict with non-tensor values or empty"
        raise HiFTLoadError(f"{path}: expected a flat state_dict of tensors, got {kind}")
    return obj


def load_hift_state_dict(
    model: HiFTBase,
    state_dict: dict[str, torch.Tensor],
    *,
    fold_weight_norm: bool = True,
    source: str = "hift.pt",
) -> None:
    """Strictly copy a (normalised) hift state_dict into `model` (on CPU, before moving it)."""
    expected = expected_hift_shapes(model)
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise HiFTLoadError(
            f"{source}: key set does not match {type(model).__name__}(base_channels={model.config.base_channels}): "
            f"{len(missing)} missing [{_short_list(missing)}], "
            f"{len(unexpected)} unexpected [{_short_list(unexpected)}]; "
            f"expected {len(expected)} keys, file has {len(state_dict)}"
        )
    wrong = [
        f"{k}: file {tuple(state_dict[k].shape)} vs model {expected[k]}"
        for k in sorted(expected)
        if tuple(state_dict[k].shape) != expected[k]
    ]
    if wrong:
        raise HiFTLoadError(f"{source}: {len(wrong)} tensors have the wrong shape: {_short_list(wrong, 6)}")
    # Every tensor in the dtype of the parameter it fills (the causal F0 predictor is float64).
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    tensors = dict(state_dict)
    modules = model.weight_norm_modules()
    if fold_weight_norm:
        for name, module in modules:
            dtype = module.weight.dtype
            g = tensors.pop(name + _NEW_G).to(dtype)
            v = tensors.pop(name + _NEW_V).to(dtype)
            # The same kernel nn.utils.parametrizations.weight_norm runs per forward: bit-identical.
            tensors[f"{name}.weight"] = torch._weight_norm(v, g, 0)
    else:
        for _, module in modules:
            nn.utils.parametrizations.weight_norm(module, name="weight", dim=0)
        dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.to(dtypes[k]) for k, v in tensors.items()}, strict=True)


def read_hift_checkpoint(
    path: str | os.PathLike[str], *, base: HiFTConfig, conv_pre_kernel: int
) -> tuple[Path, dict[str, torch.Tensor], HiFTConfig]:
    """Read `path` (either weight-norm scheme, optional `generator.` prefix): (path, normalised tensors, config)."""
    path = Path(path)
    state_dict = normalize_hift_keys(_read_state_dict(path), source=str(path))
    config = infer_hift_config(state_dict, source=str(path), base=base, conv_pre_kernel=conv_pre_kernel)
    return path, state_dict, config


def build_loaded(
    path: Path,
    state_dict: dict[str, torch.Tensor],
    build: Callable[[], ModelT],
    *,
    device: DeviceSpec,
    fold_weight_norm: bool,
) -> ModelT:
    """`build()` a model, load `state_dict` into it strictly on the CPU, move it to `device`, eval mode."""
    model = build()
    load_hift_state_dict(model, state_dict, fold_weight_norm=fold_weight_norm, source=str(path))
    target = normalize_device(device)
    model = model.to(target).eval()
    logger.info(
        "loaded %s from %s (%d keys, %d params, base_channels=%d, weight norm %s) on %s",
        type(model).__name__,
        path,
        len(state_dict),
        sum(p.numel() for p in model.parameters()),
        model.config.base_channels,
        "folded" if fold_weight_norm else "parametrised",
        target,
    )
    return model


def load_hift(
    path: str | os.PathLike[str],
    *,
    device: DeviceSpec = None,
    fold_weight_norm: bool = True,
    dtype: torch.dtype = torch.float32,
) -> HiFTGenerator:
    """Build the in-tree HiFT from `hift.pt` (either weight-norm scheme, optional `generator.` prefix).

    Returns the model in eval mode on `device` (default: the serving platform's device), built in
    `dtype` regardless of the process default dtype.
    """
    path, state_dict, config = read_hift_checkpoint(path, base=FULL_HIFT_CONFIG, conv_pre_kernel=HIFT_CONV_PRE_KERNEL)
    return build_loaded(
        path, state_dict, lambda: HiFTGenerator(config, dtype=dtype), device=device, fold_weight_norm=fold_weight_norm
    )
