# SPDX-License-Identifier: Apache-2.0
"""Map the weights of `speech_tokenizer_v2_25hz.onnx` into the in-tree `SpeechTokenizerV2`, strictly.

The shipped file does not name its tensors after the torch state_dict: MatMul weights are stored
transposed ([in, out]) under names derived from their node, conv weights are anonymous
(`onnx::Conv_*`), LayerNorm scale/bias are only recognisable as inputs 1/2 of their
`LayerNormalization` node. So the mapping goes through the *consuming node*, whose name carries
the torch-exporter scope of the module:

| consumer node                                  | initializer input | torch key (prefix `encoder.`)       |
|------------------------------------------------|-------------------|-------------------------------------|
| `/blocks.0/attn/query/MatMul`                  | the weight        | `blocks.0.attn.query.weight` (.T)   |
| `/blocks.0/attn/query/Add` (after that MatMul) | the other operand | `blocks.0.attn.query.bias`          |
| `/conv1/Conv`                                  | 1 / 2             | `conv1.weight` / `conv1.bias`       |
| `/blocks.0/attn_ln/LayerNormalization`         | 1 / 2             | `blocks.0.attn_ln.weight` / `.bias` |
| `/blocks.0/mlp/mlp.0/MatMul`                   | the weight        | `blocks.0.mlp.0.weight` (.T)        |
| `/quantizer/_codebook/project_down/MatMul`     | the weight        | `quantizer._codebook.project_down.weight` |

(a leading `/encoder` scope is accepted too). Weight-like initializers are those feeding MatMul,
Conv, Gemm or LayerNormalization, or an Add right after a MatMul; everything else (shape
constants, RoPE tables, FSQ powers) is a constant of the graph; weights held in `Constant` nodes
count as initializers. Every weight-like initializer must
land on a model parameter with the right shape and every parameter must be filled exactly once,
otherwise `SpeechTokenizerOnnxError` lists the unused initializers and the unfilled parameters.
The encoder width, depth and MLP size are read from the file (heads = width / 64).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import (
    FULL_TOKENIZER_CONFIG,
    N_MELS,
    SpeechTokenizerV2Config,
)
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.model import SpeechTokenizerV2
from vllm_omni_token2wav.platforms import DeviceSpec, normalize_device

logger = init_logger(__name__)

_WEIGHT_OPS = ("MatMul", "Gemm", "Conv", "LayerNormalization")


class SpeechTokenizerOnnxError(ValueError):
    """The ONNX file is not (or does not match) a speech tokenizer v2 export."""


@dataclass
class OnnxWeight:
    """One weight-like initializer and where the loader wants to put it."""

    initializer: str
    node: str
    torch_key: str | None
    array: np.ndarray
    transpose: bool


def _short_list(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def module_path_of_node(node_name: str) -> str | None:
    """`/blocks.0/mlp/mlp.0/MatMul` -> `encoder.blocks.0.mlp.0` (None for a node outside any module)."""
    scopes = [part for part in node_name.split("/") if part][:-1]
    if not scopes:
        return None
    path: list[str] = []
    for scope in scopes:
        # The torch exporter names a container child "<container>.<index>" inside the container's scope.
        if path and scope.startswith(path[-1] + "."):
            path[-1] = scope
        else:
            path.append(scope)
    module = ".".join(path)
    if module.startswith(("encoder.", "quantizer.")):
        return module
    return f"encoder.{module}"


def collect_onnx_weights(model_proto: Any) -> list[OnnxWeight]:
    """Classify the initializers of `model_proto` and propose a torch key for each weight-like one."""
    from onnx import numpy_helper

    graph = model_proto.graph
    inits = {init.name: init for init in graph.initializer}
    # Some exporters keep folded weights as Constant nodes instead of initializers: treat them alike.
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    inits.setdefault(node.output[0], attr.t)
    producer = {out: node for node in graph.node for out in node.output if node.op_type != "Constant"}
    weights: list[OnnxWeight] = []
    seen: set[str] = set()
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name not in inits or name in seen:
                continue
            key: str | None = None
            transpose = False
            if node.op_type in _WEIGHT_OPS:
                path = module_path_of_node(node.name)
                suffix = "bias" if index == 2 else "weight"
                key = f"{path}.{suffix}" if path else None
                if node.op_type == "MatMul":
                    transpose = index == 1  # stored [in, out]
                elif node.op_type == "Gemm" and index == 1:
                    trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
                    transpose = trans_b == 0
            elif node.op_type == "Add":
                other = node.input[1 - index] if len(node.input) == 2 else ""
                if other not in producer or producer[other].op_type != "MatMul":
                    continue  # a constant of the graph, not a bias
                path = module_path_of_node(node.name)
                key = f"{path}.bias" if path else None
            else:
                continue
            array = numpy_helper.to_array(inits[name])
            if not np.issubdtype(array.dtype, np.floating):
                continue
            seen.add(name)
            weights.append(OnnxWeight(name, node.name, key, array, transpose and array.ndim == 2))
    return weights


def infer_tokenizer_config(weights: list[OnnxWeight], source: str) -> SpeechTokenizerV2Config:
    by_key = {w.torch_key: w for w in weights if w.torch_key}
    conv1 = by_key.get("encoder.conv1.weight")
    if conv1 is None or conv1.array.ndim != 3:
        nodes = sorted({w.node for w in weights})
        raise SpeechTokenizerOnnxError(
            f"{source}: no `/conv1/Conv` weight [n_state, {N_MELS}, 3]; this is not a speech tokenizer v2 export "
            f"(weighted nodes: {_short_list(nodes, 6)})"
        )
    n_state, n_mels = int(conv1.array.shape[0]), int(conv1.array.shape[1])
    blocks = {int(k.split(".")[2]) for k in by_key if k.startswith("encoder.blocks.") and k.split(".")[2].isdigit()}
    n_layer = max(blocks) + 1 if blocks else 0
    mlp = by_key.get("encoder.blocks.0.mlp.0.weight")
    n_mlp = int(mlp.array.shape[-1]) if mlp is not None and mlp.array.ndim == 2 else FULL_TOKENIZER_CONFIG.n_mlp
    if n_mels != N_MELS:
        raise SpeechTokenizerOnnxError(f"{source}: conv1 takes {n_mels} mel bins, the v2 front end makes {N_MELS}")
    try:
        return SpeechTokenizerV2Config(n_mels=n_mels, n_state=n_state, n_layer=n_layer, n_mlp=n_mlp)
    except ValueError as exc:
        raise SpeechTokenizerOnnxError(f"{source}: {exc}") from None


def load_speech_tokenizer_from_onnx(
    path: str | os.PathLike[str], *, device: DeviceSpec = "cpu", dtype: torch.dtype = torch.float32
) -> SpeechTokenizerV2:
    """Build the in-tree tokenizer with the weights of `path`; eval mode, on `device` (None: serving device)."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"speech tokenizer ONNX file not found: {path}")
    try:
        model_proto = onnx.load(str(path))
    except Exception as exc:
        raise SpeechTokenizerOnnxError(f"{path}: cannot be parsed as ONNX ({type(exc).__name__}: {exc})") from exc
    weights = collect_onnx_weights(model_proto)
    config = infer_tokenizer_config(weights, str(path))
    model = SpeechTokenizerV2(config, dtype=dtype)
    params = model.state_dict()

    filled: dict[str, torch.Tensor] = {}
    unused: list[str] = []
    wrong_shape: list[str] = []
    for w in weights:
        if w.torch_key is None or w.torch_key not in params or w.torch_key in filled:
            unused.append(f"{w.initializer} (node {w.node})")
            continue
        array = w.array.T if w.transpose else w.array
        want = tuple(params[w.torch_key].shape)
        if tuple(array.shape) != want:
            wrong_shape.append(f"{w.torch_key} <- {w.initializer}: {tuple(array.shape)} vs {want}")
            continue
        filled[w.torch_key] = torch.from_numpy(np.array(array, dtype=array.dtype, copy=True))
    unmapped = sorted(set(params) - set(filled) - {k.split(" <- ")[0] for k in wrong_shape})
    if unused or unmapped or wrong_shape:
        raise SpeechTokenizerOnnxError(
            f"{path}: weights do not map onto SpeechTokenizerV2(n_state={config.n_state}, n_layer={config.n_layer}): "
            f"{len(unused)} unused initializers [{_short_list(unused)}]; "
            f"{len(unmapped)} unmapped parameters [{_short_list(unmapped)}]; "
            f"{len(wrong_shape)} shape mismatches [{_short_list(wrong_shape, 5)}]"
        )
    model.load_state_dict({k: v.to(dtype) for k, v in filled.items()}, strict=True)
    target = normalize_device(device)
    model = model.to(target).eval()
    logger.info(
        "loaded speech tokenizer v2 from %s (%d weights, %d params, n_state=%d, %d blocks) on %s",
        path,
        len(filled),
        sum(p.numel() for p in model.parameters()),
        config.n_state,
        config.n_layer,
        target,
    )
    return model
