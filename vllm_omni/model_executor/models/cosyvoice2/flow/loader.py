# SPDX-License-Identifier: Apache-2.0
"""Load `flow.yaml` + `flow.pt` onto the serving device, and write deterministic stand-ins of them.

Loading follows the reference: build from the YAML, `.half()` first when `float16` (so fp16 weights
load into fp16 parameters), `load_state_dict(strict=True)`, move to the device, `eval()`. Modules are
built in float32 with explicit dtypes, so a bf16 process default (vLLM's model loading) changes nothing.

Stand-ins: models cannot be downloaded in CI, so `write_standin_flow` writes a `flow.yaml` (the real
hyperparameters, or `REDUCED_FLOW_CONFIG`) and a `flow.pt` with seeded random weights of the exact
key layout. The end-to-end Token2Wav stand-in directory is assembled from these.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from vllm_omni.atomic_io import atomic_output, write_bytes_atomic
from vllm_omni.logger import init_logger
from vllm_omni.model_executor.models.cosyvoice2.flow.config import (
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    build_flow_from_yaml,
    render_flow_yaml,
)
from vllm_omni.model_executor.models.cosyvoice2.flow.flow import CausalMaskedDiffWithXvec

logger = init_logger(__name__)

FLOW_YAML = "flow.yaml"
FLOW_PT = "flow.pt"


def standin_state_dict(model: CausalMaskedDiffWithXvec, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights of `model`'s exact layout, scaled so activations stay O(1) through the stack.

    Zero-mean uniform noise (cheaper than normal at 155M values) with standard deviation: matrices
    sqrt(0.5 / fan_in), embedding rows 0.5, biases 0.01, LayerNorm weights 1 + 0.01 noise, rel-pos
    biases 0.1. Generated on CPU in float32, key by key in sorted order, so the result depends only on
    the seed and the config.
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, param in sorted(model.state_dict().items()):
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


def write_standin_flow(directory: str | Path, *, reduced: bool, seed: int) -> tuple[Path, Path]:
    """Write `flow.yaml` + `flow.pt` (deterministic in `seed`) into `directory`; returns their paths.

    Existing files are replaced atomically. Full size writes ~623 MB of float32 weights.
    """
    directory = Path(directory)
    yaml_path, pt_path = directory / FLOW_YAML, directory / FLOW_PT
    start = time.perf_counter()
    text = render_flow_yaml(REDUCED_FLOW_CONFIG if reduced else REAL_FLOW_CONFIG)
    model = build_flow_from_yaml(text)
    state = standin_state_dict(model, seed)
    del model
    # weights first: a complete flow.yaml next to a flow.pt means both are whole
    with atomic_output(pt_path) as tmp:
        torch.save(state, tmp)
    write_bytes_atomic(yaml_path, text.encode())
    logger.info(
        "wrote %s stand-in flow (%d tensors, seed %d) to %s in %.1f s",
        "reduced" if reduced else "full-size",
        len(state),
        seed,
        directory,
        time.perf_counter() - start,
    )
    return yaml_path, pt_path


def standin_flow_dir(*, reduced: bool, seed: int) -> Path:
    """Cache folder of the stand-in flow for these options (under `vllm_omni.envs.cache_dir`)."""
    from vllm_omni import envs

    return envs.cache_dir("standins", f"flow-{'reduced' if reduced else 'full'}-seed{seed}")


def ensure_standin_flow(*, reduced: bool, seed: int = 0) -> Path:
    """Folder holding a cached stand-in `flow.yaml` + `flow.pt`, written first if missing.

    Safe to call from several processes at once: a file lock serialises the writers and the files
    appear atomically. Pass the folder to `load_flow`.
    """
    from filelock import FileLock  # a torch dependency: always installed alongside torch

    directory = standin_flow_dir(reduced=reduced, seed=seed)
    if (directory / FLOW_YAML).is_file() and (directory / FLOW_PT).is_file():
        return directory
    with FileLock(str(directory / ".write.lock")):
        if not ((directory / FLOW_YAML).is_file() and (directory / FLOW_PT).is_file()):
            write_standin_flow(directory, reduced=reduced, seed=seed)
    return directory


def _resolve(source: str | Path | tuple[str | Path, str | Path]) -> tuple[Path, Path]:
    if isinstance(source, tuple):
        yaml_path, pt_path = Path(source[0]), Path(source[1])
    else:
        yaml_path, pt_path = Path(source) / FLOW_YAML, Path(source) / FLOW_PT
    for p in (yaml_path, pt_path):
        if not p.is_file():
            raise FileNotFoundError(f"flow model file not found: {p} (a token2wav directory holds flow.yaml + flow.pt)")
    return yaml_path, pt_path


def load_flow(
    source: str | Path | tuple[str | Path, str | Path],
    *,
    device: torch.device | str | None = None,
    float16: bool = False,
    noise_seed: int = 0,
) -> CausalMaskedDiffWithXvec:
    """Build and load the flow model from a token2wav directory or a `(flow.yaml, flow.pt)` pair.

    `device` defaults to the platform's serving device. `float16` halves the model before loading
    (reference behaviour). Raises ValueError naming missing / unexpected / wrongly shaped keys.
    """
    from vllm_omni import platforms

    yaml_path, pt_path = _resolve(source)
    target = torch.device(device) if device is not None else platforms.current_omni_platform.torch_device()
    start = time.perf_counter()
    model = build_flow_from_yaml(yaml_path, noise_seed=noise_seed)
    if float16:
        model.half()
    try:
        try:
            # mmap: no second in-memory copy of the 623 MB file before load_state_dict copies it in
            state = torch.load(pt_path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) serialization cannot be memory-mapped
            state = torch.load(pt_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt / non-weights files
        raise ValueError(f"{pt_path}: cannot read as a torch state_dict: {exc}") from exc
    if not isinstance(state, dict):
        raise ValueError(f"{pt_path}: expected a state_dict (dict of tensors), got {type(state).__name__}")
    want = model.state_dict()
    missing = sorted(set(want) - set(state))
    unexpected = sorted(set(state) - set(want))
    if missing or unexpected:
        raise ValueError(
            f"{pt_path}: key layout does not match {yaml_path.name} ({len(state)} keys in file, {len(want)} expected); "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}; is this the flow.pt that belongs to this flow.yaml?"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(want[key].shape):
            raise ValueError(
                f"{pt_path}: tensor {key!r} has shape {tuple(value.shape)}, expected {tuple(want[key].shape)} "
                f"from {yaml_path.name}; flow.yaml and flow.pt disagree on the model size"
            )
    model.load_state_dict(state, strict=True)
    model.to(target).eval()
    logger.info(
        "loaded flow model from %s (%s, %s) in %.1f s",
        pt_path,
        target,
        "float16" if float16 else "float32",
        time.perf_counter() - start,
    )
    return model
