# SPDX-License-Identifier: Apache-2.0
"""Read `*.pt` weights, check them against a model strictly, and write deterministic stand-ins of them.

Shipped checkpoints are plain state_dicts (`flow.pt`). Loading them is the same for every family:
read (memory-mapped when the file allows, so a 1.3 GB file is not held twice), compare the key set
and every shape with the model built from the config, and fail with a message that names the file,
the tensors and the likely cause instead of torch's generic `load_state_dict` error.

Real weights cannot be downloaded in CI, so the same modules also produce stand-ins: seeded random
weights of the model's exact layout (`standin_state_dict`), written once into the project cache
(`ensure_cached_files`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The state_dict in `path` (CPU tensors, memory-mapped where the format allows)."""
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) serialization cannot be memory-mapped
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt / non-weights files
        raise ValueError(f"{path}: cannot read as a torch state_dict: {exc}") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state_dict (dict of tensors), got {type(state).__name__}")
    return state


def _short(names: list[str]) -> str:
    return f"{names[:5]}{'...' if len(names) > 5 else ''}"


def check_state_dict_layout(
    state: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor | torch.Size | tuple[int, ...]],
    *,
    source: str,
    against: str,
    hint: str,
) -> None:
    """Raise ValueError unless `state` has exactly `want`'s keys, each with `want`'s shape.

    `against` names what the expectation comes from (`flow.yaml`), `hint` is the likely fix.
    """
    missing = sorted(set(want) - set(state))
    unexpected = sorted(set(state) - set(want))
    if missing or unexpected:
        raise ValueError(
            f"{source}: key layout does not match {against} ({len(state)} keys in file, {len(want)} expected); "
            f"missing {_short(missing)}, unexpected {_short(unexpected)}; {hint}"
        )
    for key, value in state.items():
        expected = want[key]
        shape = tuple(expected.shape) if isinstance(expected, torch.Tensor) else tuple(expected)
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{source}: tensor {key!r} has shape {tuple(value.shape)}, expected {shape} from {against}; "
                f"{against} and the weights disagree on the model size"
            )


def load_checked(
    model: nn.Module,
    weights_path: Path,
    *,
    device: torch.device | str | None,
    float16: bool = False,
    dtype: torch.dtype | None = None,
    against: str,
    hint: str,
    what: str,
) -> nn.Module:
    """Load `weights_path` into `model` strictly and move it to `device` in eval mode; returns `model`.

    `float16` halves the model first (the reference's fp16 mode: fp16 weights load into fp16
    parameters); `dtype` (float32, float16 or bfloat16) does the same for any of them and wins over
    `float16`. `device` None means the platform's serving device. Layout errors name the file, the
    tensor and `against` (what the model was built from), with `hint` as the likely fix. A model built
    on the meta device (allowed only when the state_dict holds all of its tensors: no non-persistent
    buffers) is materialised after the layout check, so a wrong file fails before any allocation.
    """
    persistent = set(model.state_dict())
    if any(t.is_meta for t in model.state_dict().values()) and any(
        name not in persistent for name, _ in model.named_buffers()
    ):
        raise ValueError(f"{what}: a meta-device model must keep all its buffers in the state_dict")
    from vllm_omni_token2wav import platforms

    target = torch.device(device) if device is not None else platforms.current_omni_platform.torch_device()
    start = time.perf_counter()
    target_dtype = dtype if dtype is not None else (torch.float16 if float16 else torch.float32)
    if target_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{what}: dtype must be float32, float16 or bfloat16, got {target_dtype}")
    if target_dtype != torch.float32:
        model.to(dtype=target_dtype)  # floating parameters and buffers, as .half() does
    state = read_state_dict(weights_path)
    check_state_dict_layout(state, model.state_dict(), source=str(weights_path), against=against, hint=hint)
    if any(t.is_meta for t in model.state_dict().values()):
        # built on the meta device (no random init): memory only now that the file is known to fit;
        # the strict load fills every tensor, so nothing stays uninitialised
        model.to_empty(device="cpu")
    model.load_state_dict(state, strict=True)
    model.to(target).eval()
    logger.info(
        "loaded %s from %s (%s, %s) in %.1f s",
        what,
        weights_path,
        target,
        str(target_dtype).removeprefix("torch."),
        time.perf_counter() - start,
    )
    return model


def standin_state_dict(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights of `model`'s exact state_dict layout, scaled so activations stay O(1) through the stack.

    Zero-mean uniform noise (cheaper than normal at 10^8 values) with standard deviation: matrices and
    kernels sqrt(0.5 / fan_in), `input_embedding.weight` rows 0.5, biases 0.01, other 1-D weights
    (LayerNorm scales) 1 + 0.01 noise, rel-pos biases `pos_bias_u/v` 0.1. Persistent buffers (e.g. a
    RoPE `inv_freq`) keep the model's own values: they are constants of the architecture, not weights.
    Generated on CPU in float32, key by key in sorted order, so the result depends only on the seed
    and the layout.
    """
    buffers = {name for name, _ in model.named_buffers()}
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, param in sorted(model.state_dict().items()):
        if name in buffers:
            out[name] = param.detach().to("cpu", copy=True)
            continue
        shape = param.shape
        # uniform on [-sqrt(3), sqrt(3)] has unit variance
        noise = (torch.rand(shape, generator=gen, dtype=torch.float32) * 2.0 - 1.0) * math.sqrt(3.0)
        leaf = name.rsplit(".", 1)[-1]
        if name == "input_embedding.weight":
            value = noise * 0.5
        elif leaf in ("pos_bias_u", "pos_bias_v"):
            value = noise * 0.1
        elif leaf == "bias":
            value = noise * 0.01
        elif len(shape) == 1:  # LayerNorm scale
            value = 1.0 + noise * 0.01
        else:
            fan_in = math.prod(shape[1:])
            value = noise * math.sqrt(0.5 / fan_in)
        out[name] = value.to(param.dtype)
    return out


def write_standin_files(
    directory: Path,
    make_state: Callable[[], dict[str, torch.Tensor]],
    *,
    weights_name: str,
    config_name: str,
    config_text: str,
    what: str,
) -> tuple[Path, Path]:
    """Write `make_state()` as `directory/weights_name`, then `config_text` as `directory/config_name`.

    Weights first, both atomically: a complete config next to a weights file means both are whole
    (what `ensure_cached_files` relies on). Returns (config path, weights path); logs `what` and the time.
    """
    from vllm_omni_token2wav.atomic_io import atomic_output, write_bytes_atomic

    start = time.perf_counter()
    config_path, weights_path = directory / config_name, directory / weights_name
    state = make_state()
    with atomic_output(weights_path) as tmp:
        torch.save(state, tmp)
    write_bytes_atomic(config_path, config_text.encode())
    logger.info("wrote %s (%d tensors) to %s in %.1f s", what, len(state), directory, time.perf_counter() - start)
    return config_path, weights_path


def ensure_cached_files(directory: Path, names: tuple[str, ...], write: Callable[[Path], object]) -> Path:
    """`directory` holding all of `names`, calling `write(directory)` first if any is missing.

    Safe across processes: a file lock serialises writers, and `write` must create each file
    atomically (`vllm_omni_token2wav.atomic_io`) and the last-named one last, so a complete set means whole files.
    """
    from filelock import FileLock  # a torch dependency: always installed alongside torch

    def complete() -> bool:
        return all((directory / name).is_file() for name in names)

    if complete():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory / ".write.lock")):
        if not complete():
            write(directory)
    return directory
