# SPDX-License-Identifier: Apache-2.0
"""Map every tensor of an exported `campplus.onnx` back onto the upstream CAMPPlus module tree.

Constant folding at export time fused most BatchNorms into the conv before them and renamed the
result (`onnx::Conv_NNNN`), so the file is not a state_dict. This module recovers one, strictly:

1. Every `Conv` node gives a module path, from its weight's name when that is a torch name
   (unfused convs; the dynamo layout, where the fused weight keeps the torch name and the bias is
   `<path>.weight_bias`), else from its scoped node name (`/head/layer1/layer1.0/conv1/Conv` ->
   `head.layer1.0.conv1`: a scope that starts with its parent scope + "." replaces it, which undoes
   the doubled `Sequential` scopes). Inputs are followed through `Identity` aliases (the exporter
   merges initializers with identical values) and `Constant` nodes.
2. Every `BatchNormalization` node gives a module path from its `running_mean` name or node scope;
   scale/bias may be `Constant`s (the affine-free dense BN), which must then be exactly 1 / 0.
3. The network's hyper-parameters are read off the shapes (so reduced stand-ins load too), the
   model is built in fp32, and the tensors are copied in.

Fused Conv+BN pairs: a Conv carrying a bias where upstream's conv has none is a conv whose
following BatchNorm was folded in. The fused weight goes into the conv unchanged, and that BN
becomes an exact identity plus the fused bias: weight 1, running_mean 0, running_var 1 and
eps 0, bias = fused bias, so eval-mode BN computes `(x - 0) / sqrt(1 + 0) * 1 + b = x + b`
exactly. (eps is a module attribute, not state: the state_dict keeps upstream's keys.)

Strictness: every model tensor must be filled exactly once and every float initializer used
(scalar constants consumed by non-Conv/BN ops, e.g. the `N - 1` of the unbiased std, are the only
ones ignored); anything else raises `CampplusOnnxError` listing names and shapes, so a file of
another network fails at load instead of producing garbage.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.dtdnn import CAMPPlus
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import check_seg_pool_mode

logger = init_logger(__name__)

_MAX_LIST = 12  # names listed per problem in an error message


class CampplusOnnxError(ValueError):
    """A file that is not a loadable CAM++ export (missing, unreadable, or tensors that do not map)."""


@dataclass(frozen=True)
class _Tensor:
    name: str  # the initializer or Constant output the value comes from (after Identity aliases)
    array: np.ndarray
    is_initializer: bool


@dataclass
class _ConvEntry:
    node: str
    weight: _Tensor
    bias: _Tensor | None


@dataclass
class _BnEntry:
    node: str
    scale: _Tensor
    bias: _Tensor
    mean: _Tensor
    var: _Tensor
    eps: float


@dataclass
class _Graph:
    path: Path
    initializers: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    aliases: dict[str, str]
    convs: dict[str, _ConvEntry] = field(default_factory=dict)
    bns: dict[str, _BnEntry] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)


def _shape_list(items: Iterable[tuple[str, tuple[int, ...]]]) -> str:
    items = list(items)
    text = ", ".join(f"{name} {list(shape)}" for name, shape in items[:_MAX_LIST])
    if len(items) > _MAX_LIST:
        text += f", ... ({len(items) - _MAX_LIST} more)"
    return text


def _read_model(path: Path):  # -> onnx.ModelProto
    import onnx
    from google.protobuf.message import DecodeError

    if not path.exists():
        raise CampplusOnnxError(f"campplus.onnx not found: {path} (set the model directory or CAMPPLUS_ONNX_PATH)")
    if not path.is_file():
        raise CampplusOnnxError(f"campplus.onnx path is not a file: {path}")
    try:
        model = onnx.load(str(path))
    except (DecodeError, RuntimeError, ValueError, OSError) as exc:
        raise CampplusOnnxError(
            f"{path}: not a readable ONNX file ({type(exc).__name__}: {exc}); truncated download or wrong file?"
        ) from exc
    if not model.graph.node or not model.graph.initializer:
        raise CampplusOnnxError(
            f"{path}: parses as ONNX but has {len(model.graph.node)} nodes and {len(model.graph.initializer)} "
            "initializers; truncated download or wrong file?"
        )
    return model


def _parse(path: Path) -> _Graph:
    from onnx import numpy_helper

    model = _read_model(path)
    graph = model.graph
    try:
        initializers = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    except Exception as exc:  # external data missing, corrupt raw_data
        raise CampplusOnnxError(f"{path}: cannot read initializer data ({type(exc).__name__}: {exc})") from exc
    constants: dict[str, np.ndarray] = {}
    aliases: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = numpy_helper.to_array(attr.t)
        elif node.op_type == "Identity" and node.input and node.output:
            aliases[node.output[0]] = node.input[0]
    g = _Graph(path=path, initializers=initializers, constants=constants, aliases=aliases)
    _collect_nodes(g, graph)
    return g


def _resolve(g: _Graph, name: str) -> _Tensor | None:
    seen = 0
    while name in g.aliases and name not in g.initializers:
        name = g.aliases[name]
        seen += 1
        if seen > 64:
            raise CampplusOnnxError(f"{g.path}: Identity alias chain through {name!r} does not end")
    if name in g.initializers:
        return _Tensor(name, g.initializers[name], True)
    if name in g.constants:
        return _Tensor(name, g.constants[name], False)
    return None


def scope_to_module_path(node_name: str) -> str | None:
    """`/head/layer1/layer1.0/conv1/Conv` -> `head.layer1.0.conv1`; None for unscoped names."""
    if not node_name.startswith("/"):
        return None
    parts = node_name.strip("/").split("/")[:-1]  # the last part names the op
    out: list[str] = []
    for part in parts:
        if out and part.startswith(out[-1] + "."):
            out[-1] = part  # "layer1", "layer1.0" -> "layer1.0"
        else:
            out.append(part)
    return ".".join(out) or None


def _torch_module_of(name: str, suffixes: tuple[str, ...]) -> str | None:
    if name.startswith("onnx::"):
        return None
    for suffix in suffixes:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def _constant_input(g: _Graph, node, index: int, what: str) -> _Tensor:
    if len(node.input) <= index or not node.input[index]:
        raise CampplusOnnxError(f"{g.path}: {node.op_type} node {node.name!r} has no {what} input")
    tensor = _resolve(g, node.input[index])
    if tensor is None:
        raise CampplusOnnxError(
            f"{g.path}: {node.op_type} node {node.name!r}: {what} {node.input[index]!r} is computed at run time, "
            "not a constant; this loader needs an export with constant folding (do_constant_folding=True)"
        )
    return tensor


def _collect_nodes(g: _Graph, graph) -> None:
    for node in graph.node:
        if node.op_type == "Conv":
            weight = _constant_input(g, node, 1, "weight")
            bias = _constant_input(g, node, 2, "bias") if len(node.input) > 2 and node.input[2] else None
            module = _torch_module_of(weight.name, (".weight",)) or scope_to_module_path(node.name)
            if module is None:
                raise CampplusOnnxError(
                    f"{g.path}: cannot tell which module Conv node {node.name!r} (weight {weight.name!r} "
                    f"{list(weight.array.shape)}) belongs to: neither a torch-named weight nor a scoped node name"
                )
            if module in g.convs:
                raise CampplusOnnxError(
                    f"{g.path}: two Conv nodes map to module {module!r} ({g.convs[module].node!r}, {node.name!r})"
                )
            g.convs[module] = _ConvEntry(node.name, weight, bias)
        elif node.op_type == "BatchNormalization":
            scale, bias, mean, var = (_constant_input(g, node, i, w) for i, w in enumerate(_BN_INPUTS, start=1))
            module = _torch_module_of(mean.name, (".running_mean",)) or scope_to_module_path(node.name)
            if module is None:
                raise CampplusOnnxError(
                    f"{g.path}: cannot tell which module BatchNormalization node {node.name!r} belongs to"
                )
            if module in g.bns:
                raise CampplusOnnxError(f"{g.path}: two BatchNormalization nodes map to module {module!r}")
            eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
            g.bns[module] = _BnEntry(node.name, scale, bias, mean, var, float(eps))


_BN_INPUTS = ("scale", "bias", "running_mean", "running_var")


def _infer_config(g: _Graph) -> dict[str, object]:
    """Hyper-parameters of the exported network, read off the mapped conv shapes."""

    def conv_shape(module: str) -> tuple[int, ...]:
        entry = g.convs.get(module)
        if entry is None:
            found = _shape_list((m, e.weight.array.shape) for m, e in g.convs.items())
            raise CampplusOnnxError(
                f"{g.path}: not a CAM++ export: no Conv for module {module!r} "
                f"(the graph has {len(g.convs)} Conv nodes: {found or 'none'})"
            )
        return tuple(entry.weight.array.shape)

    head = conv_shape("head.conv1")
    tdnn = conv_shape("xvector.tdnn.linear")
    local = conv_shape("xvector.block1.tdnnd1.cam_layer.linear_local")
    dense = conv_shape("xvector.dense.linear")
    block_layers = []
    for block in (1, 2, 3):
        count = 0
        while f"xvector.block{block}.tdnnd{count + 1}.cam_layer.linear_local" in g.convs:
            count += 1
        block_layers.append(count)
    problems = []
    if len(head) != 4 or head[1] != 1:
        problems.append(f"head.conv1 weight {list(head)} (expected [m, 1, 3, 3])")
    if len(tdnn) != 3 or len(local) != 3 or len(dense) != 3:
        problems.append(f"1-D conv weights tdnn {list(tdnn)}, linear_local {list(local)}, dense {list(dense)}")
    if min(block_layers) == 0:
        problems.append(f"dense blocks with {block_layers} layers")
    if problems:
        raise CampplusOnnxError(f"{g.path}: not a CAM++ export: " + "; ".join(problems))
    m_channels = head[0]
    if (tdnn[1] * 8) % m_channels or local[1] % local[0]:
        raise CampplusOnnxError(
            f"{g.path}: inconsistent CAM++ shapes: tdnn weight {list(tdnn)} with head width {m_channels}, "
            f"linear_local {list(local)}"
        )
    return {
        "feat_dim": tdnn[1] * 8 // m_channels,
        "embedding_size": dense[0],
        "growth_rate": local[0],
        "bn_size": local[1] // local[0],
        "init_channels": tdnn[0],
        "m_channels": m_channels,
        "block_layers": tuple(block_layers),
    }


def fusion_partners(model: CAMPPlus) -> dict[str, str]:
    """conv module path -> the BatchNorm right after it that constant folding can fuse into it."""
    partners: dict[str, str] = {"head.conv1": "head.bn1", "head.conv2": "head.bn2"}
    for name, module in model.head.named_modules():
        if name.count(".") == 1 and name.startswith("layer"):  # head.layerX.Y BasicResBlock
            partners[f"head.{name}.conv1"] = f"head.{name}.bn1"
            partners[f"head.{name}.conv2"] = f"head.{name}.bn2"
            if len(module.shortcut):
                partners[f"head.{name}.shortcut.0"] = f"head.{name}.shortcut.1"
    partners["xvector.tdnn.linear"] = "xvector.tdnn.nonlinear.batchnorm"
    for name, _ in model.xvector.named_modules():
        if re.fullmatch(r"block\d+\.tdnnd\d+", name):
            partners[f"xvector.{name}.linear1"] = f"xvector.{name}.nonlinear2.batchnorm"
    last_transit = max(n for n, _ in model.xvector.named_children() if n.startswith("transit"))
    partners[f"xvector.{last_transit}.linear"] = "xvector.out_nonlinear.batchnorm"
    return partners


class _Filler:
    """Copies arrays into the model's state, refusing double fills and shape mismatches."""

    def __init__(self, g: _Graph, model: nn.Module) -> None:
        self.g = g
        self.state = {
            k: v for k, v in model.state_dict(keep_vars=True).items() if not k.endswith("num_batches_tracked")
        }
        self.filled: dict[str, str] = {}

    def put(self, key: str, value: np.ndarray | torch.Tensor, origin: str) -> None:
        if key not in self.state:
            raise CampplusOnnxError(f"{self.g.path}: {origin} maps to {key!r}, which CAM++ does not have")
        if key in self.filled:
            raise CampplusOnnxError(f"{self.g.path}: {key!r} filled twice: by {self.filled[key]} and by {origin}")
        target = self.state[key]
        src = torch.from_numpy(np.array(value, copy=True)) if isinstance(value, np.ndarray) else value
        if tuple(src.shape) != tuple(target.shape):
            raise CampplusOnnxError(
                f"{self.g.path}: {origin} has shape {list(src.shape)}, expected {list(target.shape)} for {key!r}; "
                "is this a CAM++ export with the same widths?"
            )
        if not src.dtype.is_floating_point:
            raise CampplusOnnxError(f"{self.g.path}: {origin} has dtype {src.dtype}, expected a float tensor")
        with torch.no_grad():
            target.copy_(src.to(torch.float32))
        self.filled[key] = origin

    def use(self, tensor: _Tensor) -> None:
        if tensor.is_initializer:
            self.g.used.add(tensor.name)


def _fill(g: _Graph, model: CAMPPlus) -> None:
    filler = _Filler(g, model)
    partners = fusion_partners(model)
    modules = dict(model.named_modules())
    for path, entry in g.convs.items():
        conv = modules.get(path)
        if not isinstance(conv, nn.Conv1d | nn.Conv2d):
            raise CampplusOnnxError(
                f"{g.path}: Conv node {entry.node!r} maps to {path!r}, which is not a conv of CAM++ "
                f"(weight {entry.weight.name!r} {list(entry.weight.array.shape)})"
            )
        filler.put(f"{path}.weight", entry.weight.array, f"Conv {entry.node!r} weight {entry.weight.name!r}")
        filler.use(entry.weight)
        if entry.bias is None:
            continue
        filler.use(entry.bias)
        origin = f"Conv {entry.node!r} bias {entry.bias.name!r}"
        if conv.bias is not None:
            filler.put(f"{path}.bias", entry.bias.array, origin)
        elif path in partners:
            bn_path = partners[path]
            bn = modules[bn_path]
            assert isinstance(bn, nn.modules.batchnorm._BatchNorm)
            channels = bn.num_features
            fused = f"fused into {origin}"
            filler.put(f"{bn_path}.weight", torch.ones(channels), fused)
            filler.put(f"{bn_path}.bias", entry.bias.array, origin)
            filler.put(f"{bn_path}.running_mean", torch.zeros(channels), fused)
            filler.put(f"{bn_path}.running_var", torch.ones(channels), fused)
            bn.eps = 0.0  # with var 1: an exact identity plus the fused bias (see module docstring)
        else:
            raise CampplusOnnxError(
                f"{g.path}: {origin}: upstream conv {path!r} has no bias and no BatchNorm after it to fold into"
            )
    for path, bn_entry in g.bns.items():
        bn = modules.get(path)
        if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
            raise CampplusOnnxError(
                f"{g.path}: BatchNormalization node {bn_entry.node!r} maps to {path!r}, which is not a BatchNorm"
            )
        origin = f"BatchNormalization {bn_entry.node!r}"
        for tensor in (bn_entry.scale, bn_entry.bias, bn_entry.mean, bn_entry.var):
            filler.use(tensor)
        if bn.affine:
            filler.put(f"{path}.weight", bn_entry.scale.array, f"{origin} scale {bn_entry.scale.name!r}")
            filler.put(f"{path}.bias", bn_entry.bias.array, f"{origin} bias {bn_entry.bias.name!r}")
        elif not (np.all(bn_entry.scale.array == 1) and np.all(bn_entry.bias.array == 0)):
            raise CampplusOnnxError(
                f"{g.path}: {origin}: {path!r} is affine-free upstream, but the file's scale/bias are not 1/0"
            )
        filler.put(f"{path}.running_mean", bn_entry.mean.array, f"{origin} mean {bn_entry.mean.name!r}")
        filler.put(f"{path}.running_var", bn_entry.var.array, f"{origin} var {bn_entry.var.name!r}")
        bn.eps = bn_entry.eps

    missing = [(k, tuple(v.shape)) for k, v in filler.state.items() if k not in filler.filled]
    if missing:
        raise CampplusOnnxError(
            f"{g.path}: {len(missing)} CAM++ tensors have no source in the file: {_shape_list(missing)}"
        )
    unused = [
        (name, tuple(arr.shape))
        for name, arr in g.initializers.items()
        if arr.dtype.kind == "f" and name not in g.used and arr.size > 1
    ]
    if unused:
        raise CampplusOnnxError(
            f"{g.path}: {len(unused)} float initializers were not mapped to any CAM++ tensor: {_shape_list(unused)}"
        )


@dataclass(frozen=True)
class CampplusExport:
    """What `check_campplus_export` found: a CAM++ export and the hyper-parameters read off its shapes."""

    path: Path
    config: dict[str, object]

    @property
    def feat_dim(self) -> int:
        return int(self.config["feat_dim"])  # type: ignore[call-overload]

    @property
    def embedding_size(self) -> int:
        return int(self.config["embedding_size"])  # type: ignore[call-overload]


def _map_export(path: Path, seg_pool_mode: str, device: str) -> tuple[CAMPPlus, dict[str, object]]:
    """Map every tensor of the file at `path` onto a CAMPPlus built on `device` (raises `CampplusOnnxError`)."""
    g = _parse(path)
    config = _infer_config(g)
    try:
        model = CAMPPlus(seg_pool_mode=seg_pool_mode, dtype=torch.float32, device=device, **config)  # type: ignore[arg-type]
    except ValueError as exc:
        raise CampplusOnnxError(f"{path}: shapes describe no valid CAM++ ({config}): {exc}") from exc
    _fill(g, model)
    logger.debug("mapped %d convs and %d BNs of %s onto CAMPPlus %s", len(g.convs), len(g.bns), path, config)
    return model, config


def check_campplus_export(
    path: str | os.PathLike[str], *, feat_dim: int | None = None, embedding_size: int | None = None
) -> CampplusExport:
    """The one structural check that `path` is a CAM++ export; every backend runs it before serving the file.

    It is the strict mapping of `load_campplus_onnx` (every CAM++ tensor filled exactly once with the
    right shape, every float initializer used; module docstring) into a model on the `meta` device, so
    nothing is allocated or copied: a file of another network with the same input/output shapes fails
    here, naming what does not map. `feat_dim` / `embedding_size`, when given, must match what the file
    computes (the Token2Wav facades need 80 -> 192). Costs one ONNX parse (~0.15 s for the full-size file).
    """
    file = Path(path)
    _, config = _map_export(file, "exact", "meta")
    export = CampplusExport(file, config)
    for name, want, got in (
        ("feat_dim", feat_dim, export.feat_dim),
        ("embedding_size", embedding_size, export.embedding_size),
    ):
        if want is not None and got != want:
            raise CampplusOnnxError(
                f"{file}: a CAM++ export with {name}={got}, but {want} is needed here "
                f"(the Token2Wav speaker path takes [T, 80] fbank and gives a [1, 192] embedding)"
            )
    return export


def load_campplus_onnx(path: str | os.PathLike[str], *, seg_pool_mode: str = "legacy") -> CAMPPlus:
    """Build an eval-mode fp32 CPU CAMPPlus holding exactly the tensors of the exported file at `path`.

    The mapping is the same one `check_campplus_export` runs: loading a file is checking it.
    """
    check_seg_pool_mode(seg_pool_mode)
    model, _ = _map_export(Path(path), seg_pool_mode, "cpu")
    return model.eval()
