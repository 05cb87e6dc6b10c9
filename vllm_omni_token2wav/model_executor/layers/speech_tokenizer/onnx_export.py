# SPDX-License-Identifier: Apache-2.0
"""Export the in-tree speech tokenizer v2 to an ONNX file laid out like `speech_tokenizer_v2_25hz.onnx`.

Tests and the offline stand-in token2wav directory need a tokenizer ONNX file without the real
one. The graph is written op by op with `onnx.helper` (no torch exporter involved), which makes it
an independent second implementation of the network for the torch-vs-onnxruntime parity tests,
and lets it copy the shipped file's layout as far as it is known:

| what                          | layout in the file                                                      |
|-------------------------------|-------------------------------------------------------------------------|
| node names                    | torch-exporter scopes, `/blocks.0/attn/query/MatMul`, `/conv1/Conv`     |
| Linear weight / bias          | initializers named after their MatMul / Add node; weight stored [in, out] |
| conv1 / conv2 weight, bias    | `onnx::Conv_2216` / `_2217`, `onnx::Conv_2218` / `_2219`                |
| FSMN conv weights             | anonymous `onnx::Conv_<n>`                                              |
| FSQ `project_down`            | weight `onnx::MatMul_2536` [in, out], bias `quantizer.project_in.bias`  |
| LayerNorm scale / bias        | anonymous, inputs 1 / 2 of `LayerNormalization`                          |
| shape constants, RoPE tables  | `Constant` nodes (never initializers)                                   |
| inputs                        | `feats` float [B, 128, T], `feats_length` int32 [B]                     |
| output                        | `indices` int32 [B, T'] (FSQ codes)                                     |

Those names are what the reference ONNX-to-torch converter (`s3tokenizer.load_model`, which vLLM-Omni
0.30's Step-Audio2 / MiniCPM-o token2wav calls) relies on: it finds the two subsampling convolutions and
the FSQ projection by their anonymous names in the shipped file, every other weight by the name of the
node that consumes it (which must then lie under `/blocks.N/`), and it reads EVERY initializer a node
consumes as a weight, so graph constants must not be initializers. The in-tree loader (`onnx_loader`)
maps by graph structure instead and reads both layouts.

The shipped file has 1358 nodes (an opset-17-era torch export with more shape plumbing); this one
has fewer, but the same 102 weighted tensors at full size. Opset 17 (LayerNormalization), IR 8.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from vllm_omni_token2wav.atomic_io import atomic_output
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import HEAD_DIM
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.model import (
    FSQ_SCALE,
    MASK_BIAS,
    ResidualAttentionBlock,
    SpeechTokenizerV2,
)

OPSET = 17
IR_VERSION = 8
INPUT_FEATS = "feats"
INPUT_LENGTH = "feats_length"
OUTPUT_INDICES = "indices"
#: Initializer names of the shipped export that the reference converter looks up literally.
CONV1_WEIGHT, CONV1_BIAS = "onnx::Conv_2216", "onnx::Conv_2217"
CONV2_WEIGHT, CONV2_BIAS = "onnx::Conv_2218", "onnx::Conv_2219"
PROJECT_DOWN_WEIGHT = "onnx::MatMul_2536"
PROJECT_DOWN_BIAS = "quantizer.project_in.bias"
_RESERVED_NAMES = frozenset({CONV1_WEIGHT, CONV1_BIAS, CONV2_WEIGHT, CONV2_BIAS, PROJECT_DOWN_WEIGHT})


class _Graph:
    """Minimal graph writer: unique torch-style node names, weights as initializers, constants as nodes."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._names: set[str] = set()
        self._init_names: set[str] = set()
        self._anon = 0

    def _node_name(self, scope: str, op_type: str) -> str:
        base = f"{scope}/{op_type}"
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def init(self, array: np.ndarray, name: str | None = None, *, anon_op: str) -> str:
        """A weight initializer: `name`, else the next anonymous `onnx::<anon_op>_<n>` not reserved."""
        from onnx import numpy_helper

        while name is None:
            self._anon += 1
            candidate = f"onnx::{anon_op}_{self._anon}"
            name = None if candidate in _RESERVED_NAMES else candidate
        if name in self._init_names:
            raise ValueError(f"speech tokenizer export: initializer name {name!r} used twice")
        self._init_names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value: float | int | list[int] | list[float] | np.ndarray, dtype: Any = np.int64) -> str:
        """A graph constant, held by a `Constant` node as the torch exporter writes them."""
        from onnx import numpy_helper

        tensor = numpy_helper.from_array(np.ascontiguousarray(np.asarray(value, dtype=dtype)))
        return self.op("Constant", [], "", value=tensor)

    def op(self, op_type: str, inputs: list[str], scope: str, **attrs: Any) -> str:
        from onnx import helper

        name = self._node_name(scope, op_type)
        output = f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        return output

    # -- layers --------------------------------------------------------------------------------
    def linear(self, x: str, layer: torch.nn.Linear, scope: str, names: tuple[str, str] | None = None) -> str:
        """MatMul (+ Add): weight [in, out] and bias named after their nodes unless `names` are given."""
        weight_name, bias_name = names or (f"{scope}/MatMul", f"{scope}/Add")
        weight = self.init(layer.weight.detach().cpu().numpy().T, name=weight_name, anon_op="MatMul")
        y = self.op("MatMul", [x, weight], scope)
        if layer.bias is not None:
            bias = self.init(layer.bias.detach().cpu().numpy(), name=bias_name, anon_op="Add")
            y = self.op("Add", [y, bias], scope)
        return y

    def conv(
        self,
        x: str,
        conv: torch.nn.Conv1d,
        scope: str,
        pads: tuple[int, int] | None = None,
        names: tuple[str, str] | None = None,
    ) -> str:
        weight_name, bias_name = names or (None, None)
        inputs = [x, self.init(conv.weight.detach().cpu().numpy(), name=weight_name, anon_op="Conv")]
        if conv.bias is not None:
            inputs.append(self.init(conv.bias.detach().cpu().numpy(), name=bias_name, anon_op="Conv"))
        if pads is None:
            padding = int(conv.padding[0]) if isinstance(conv.padding, tuple) else 0
            pads = (padding, padding)
        return self.op(
            "Conv",
            inputs,
            scope,
            kernel_shape=list(conv.kernel_size),
            strides=list(conv.stride),
            pads=list(pads),
            dilations=list(conv.dilation),
            group=conv.groups,
        )

    def layer_norm(self, x: str, norm: torch.nn.LayerNorm, scope: str) -> str:
        scale = self.init(norm.weight.detach().cpu().numpy(), anon_op="LayerNormalization")
        bias = self.init(norm.bias.detach().cpu().numpy(), anon_op="LayerNormalization")
        return self.op("LayerNormalization", [x, scale, bias], scope, axis=-1, epsilon=float(norm.eps))

    def gelu(self, x: str, scope: str) -> str:
        """Exact GELU as the torch exporter writes it: x * 0.5 * (1 + erf(x / sqrt 2))."""
        y = self.op("Div", [x, self.const(math.sqrt(2.0), np.float32)], scope)
        y = self.op("Erf", [y], scope)
        y = self.op("Add", [y, self.const(1.0, np.float32)], scope)
        y = self.op("Mul", [x, y], scope)
        return self.op("Mul", [y, self.const(0.5, np.float32)], scope)

    def mask(self, time_1d: str, lengths: str, scope: str) -> str:
        """[B, T] float mask from a [1] int64 time and [B] int64 lengths."""
        limit = self.op("Squeeze", [time_1d, self.const([0])], scope)
        positions = self.op("Range", [self.const(0), limit, self.const(1)], scope)
        less = self.op(
            "Less",
            [
                self.op("Unsqueeze", [positions, self.const([0])], scope),
                self.op("Unsqueeze", [lengths, self.const([1])], scope),
            ],
            scope,
        )
        return self.op("Cast", [less], scope, to=1)  # FLOAT

    def conv_length(self, lengths: str, scope: str) -> str:
        y = self.op("Sub", [lengths, self.const(1)], scope)
        y = self.op("Div", [y, self.const(2)], scope)
        return self.op("Add", [y, self.const(1)], scope)


def _rotate(graph: _Graph, x: str, cos: str, sin: str, scope: str) -> str:
    half = HEAD_DIM // 2
    first = graph.op("Slice", [x, graph.const([0]), graph.const([half]), graph.const([3])], scope)
    second = graph.op("Slice", [x, graph.const([half]), graph.const([HEAD_DIM]), graph.const([3])], scope)
    rotated = graph.op("Concat", [graph.op("Neg", [second], scope), first], scope, axis=3)
    return graph.op("Add", [graph.op("Mul", [x, cos], scope), graph.op("Mul", [rotated, sin], scope)], scope)


def build_speech_tokenizer_graph(model: SpeechTokenizerV2) -> Any:
    """The `onnx.ModelProto` of `model` (weights copied as float32)."""
    from onnx import TensorProto, helper

    config = model.config
    enc = model.encoder
    g = _Graph()
    n_state, n_head = config.n_state, config.n_head

    lengths = g.op("Cast", [INPUT_LENGTH], "", to=TensorProto.INT64)
    time0 = g.op("Shape", [INPUT_FEATS], "", start=2, end=3)
    mask0 = g.op("Unsqueeze", [g.mask(time0, lengths, ""), g.const([1])], "")
    x = g.gelu(g.conv(g.op("Mul", [INPUT_FEATS, mask0], ""), enc.conv1, "/conv1", names=(CONV1_WEIGHT, CONV1_BIAS)), "")
    lengths = g.conv_length(lengths, "")
    time1 = g.op("Shape", [x], "", start=2, end=3)
    mask1 = g.op("Unsqueeze", [g.mask(time1, lengths, ""), g.const([1])], "")
    x = g.gelu(g.conv(g.op("Mul", [x, mask1], ""), enc.conv2, "/conv2", names=(CONV2_WEIGHT, CONV2_BIAS)), "")
    lengths = g.conv_length(lengths, "")
    time2 = g.op("Shape", [x], "", start=2, end=3)
    mask2 = g.mask(time2, lengths, "")  # [B, T]
    x = g.op("Transpose", [x], "", perm=[0, 2, 1])
    mask_pad = g.op("Unsqueeze", [mask2, g.const([2])], "")  # [B, T, 1]
    bias = g.op("Mul", [g.op("Sub", [g.const(1.0, np.float32), mask2], ""), g.const(MASK_BIAS, np.float32)], "")
    bias = g.op("Unsqueeze", [bias, g.const([1, 2])], "")  # [B, 1, 1, T]
    cos_table = g.const(enc.rope_cos.detach().cpu().numpy(), np.float32)
    sin_table = g.const(enc.rope_sin.detach().cpu().numpy(), np.float32)
    cos = g.op("Slice", [cos_table, g.const([0]), time2, g.const([0])], "")
    sin = g.op("Slice", [sin_table, g.const([0]), time2, g.const([0])], "")
    cos = g.op("Unsqueeze", [cos, g.const([0, 2])], "")  # [1, T, 1, 64]
    sin = g.op("Unsqueeze", [sin, g.const([0, 2])], "")
    scale = g.const(HEAD_DIM**-0.25, np.float32)
    heads_shape = g.const([0, 0, n_head, HEAD_DIM])
    flat_shape = g.const([0, 0, n_state])

    blocks = cast(list[ResidualAttentionBlock], list(enc.blocks))
    for i, block in enumerate(blocks):
        scope = f"/blocks.{i}"
        attn = f"{scope}/attn"
        h = g.layer_norm(x, block.attn_ln, f"{scope}/attn_ln")
        q = g.op("Reshape", [g.linear(h, block.attn.query, f"{attn}/query"), heads_shape], attn)
        k = g.op("Reshape", [g.linear(h, block.attn.key, f"{attn}/key"), heads_shape], attn)
        v_flat = g.linear(h, block.attn.value, f"{attn}/value")
        # FSMN memory over the (masked) values, before RoPE.
        v_masked = g.op("Mul", [v_flat, mask_pad], attn)
        memory = g.op("Transpose", [v_masked], attn, perm=[0, 2, 1])
        # torch pads explicitly before the (padding 0) depthwise conv; the Conv's own pads are equivalent.
        fsmn_pads = (block.attn.left_pad, block.attn.right_pad)
        memory = g.conv(memory, block.attn.fsmn_block, f"{attn}/fsmn_block", pads=fsmn_pads)
        memory = g.op("Transpose", [memory], attn, perm=[0, 2, 1])
        memory = g.op("Mul", [g.op("Add", [memory, v_masked], attn), mask_pad], attn)
        q = _rotate(g, q, cos, sin, attn)
        k = _rotate(g, k, cos, sin, attn)
        q = g.op("Mul", [g.op("Transpose", [q], attn, perm=[0, 2, 1, 3]), scale], attn)
        k = g.op("Mul", [g.op("Transpose", [k], attn, perm=[0, 2, 3, 1]), scale], attn)
        v = g.op("Transpose", [g.op("Reshape", [v_flat, heads_shape], attn)], attn, perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("MatMul", [q, k], attn), bias], attn)
        weights = g.op("Softmax", [scores], attn, axis=-1)
        attended = g.op("Transpose", [g.op("MatMul", [weights, v], attn)], attn, perm=[0, 2, 1, 3])
        attended = g.op("Reshape", [attended, flat_shape], attn)
        attn_out = g.op("Add", [g.linear(attended, block.attn.out, f"{attn}/out"), memory], attn)
        x = g.op("Add", [x, attn_out], scope)
        h = g.layer_norm(x, block.mlp_ln, f"{scope}/mlp_ln")
        h = g.linear(h, cast(torch.nn.Linear, block.mlp[0]), f"{scope}/mlp/mlp.0")
        h = g.gelu(h, f"{scope}/mlp/mlp.1")
        h = g.linear(h, cast(torch.nn.Linear, block.mlp[2]), f"{scope}/mlp/mlp.2")
        x = g.op("Add", [x, h], scope)

    fsq = "/quantizer/_codebook"
    h = g.op(
        "Tanh",
        [
            g.linear(
                x,
                model.quantizer._codebook.project_down,
                f"{fsq}/project_down",
                names=(PROJECT_DOWN_WEIGHT, PROJECT_DOWN_BIAS),
            )
        ],
        fsq,
    )
    digits = g.op("Round", [g.op("Mul", [h, g.const(FSQ_SCALE, np.float32)], fsq)], fsq)
    digits = g.op("Add", [digits, g.const(1.0, np.float32)], fsq)
    powers = g.const([float(config.fsq_levels**i) for i in range(config.fsq_dims)], np.float32)
    codes = g.op("ReduceSum", [g.op("Mul", [digits, powers], fsq), g.const([-1])], fsq, keepdims=0)
    codes = g.op("Cast", [codes], fsq, to=TensorProto.INT32)
    g.nodes[-1].output[0] = OUTPUT_INDICES

    graph = helper.make_graph(
        g.nodes,
        "speech_tokenizer_v2_standin",
        [
            helper.make_tensor_value_info(INPUT_FEATS, TensorProto.FLOAT, ["batch", config.n_mels, "frames"]),
            helper.make_tensor_value_info(INPUT_LENGTH, TensorProto.INT32, ["batch"]),
        ],
        [helper.make_tensor_value_info(OUTPUT_INDICES, TensorProto.INT32, ["batch", "tokens"])],
        initializer=g.initializers,
    )
    onnx_model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="vllm_omni_token2wav stand-in"
    )
    onnx_model.ir_version = IR_VERSION
    return onnx_model


def export_speech_tokenizer_onnx(model: SpeechTokenizerV2, path: str | os.PathLike[str]) -> Path:
    """Write `model` as a stand-in speech tokenizer ONNX file (atomically) and return the path."""
    import onnx

    onnx_model = build_speech_tokenizer_graph(model)
    onnx.checker.check_model(onnx_model)
    path = Path(path)
    with atomic_output(path) as tmp:
        onnx.save_model(onnx_model, str(tmp))
    return path
