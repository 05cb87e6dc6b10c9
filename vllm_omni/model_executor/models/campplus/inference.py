# SPDX-License-Identifier: Apache-2.0
"""Eval-time CAM++: the same function as `CAMPPlus.forward`, computed with fewer and cheaper ops.

`CAMPPlus` keeps upstream's modules so checkpoints and the ONNX mapping stay simple; this form is
what serves. It is derived from an eval-mode model once and never trained. Rewrites, each exact in
real arithmetic (only fp32 rounding changes):

- every BatchNorm that directly follows a conv is folded into it (`W * s`, `(b - mean) * s + beta`
  with `s = gamma / sqrt(var + eps)`, computed in fp64 and rounded once); for models loaded from
  ONNX those BNs are exact identities (see `onnx_import`) so the fold reproduces the file's weights
  bit for bit;
- the pre-activation BNs (`nonlinear1`, transit) become one `addcmul` + in-place ReLU;
- the dense blocks run time-major ([B, T', C]) so every 1x1 conv is one GEMM with fused bias
  (`F.linear`), and write each layer's 32 new channels into a preallocated [B, T', C_final] buffer
  instead of re-concatenating (upstream's `torch.cat` copies O(L^2) data per block);
- the CAM context MLP (`linear1`, ReLU, `linear2`, sigmoid) runs once per 100-frame segment
  instead of once per frame: its input is constant over a segment, so so is its output;
- the dilated 3-tap `linear_local` is one GEMM from z to all three taps ([T', 3 * growth]) and two
  shifted in-place adds into the block buffer (no padded, tap-concatenated copy of z);
- with one segment (T <= 200) the context `mean_T(z) + seg_mean(z)` is one reduction times
  `1/T' + 1/divisor`;
- on CPU the FCM head runs channels-last, oneDNN's preferred layout (no reorder around each conv).

Those last three saved 4-15 % per call at T = 97..1000 on the 2-core CPU (1 and 2 threads).

Validated against `CAMPPlus.forward` and onnxruntime (tests/model_executor/models/campplus).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni.model_executor.models.campplus.dtdnn import CAMPPlus
from vllm_omni.model_executor.models.campplus.layers import BasicResBlock, CAMDenseTDNNBlock, TransitLayer
from vllm_omni.model_executor.models.campplus.segpool import SEG_LEN

Tensor = torch.Tensor


def _bn_scale_shift(bn: nn.modules.batchnorm._BatchNorm) -> tuple[Tensor, Tensor]:
    """Eval BN as `x * scale + shift` (fp64)."""
    assert bn.running_mean is not None and bn.running_var is not None
    scale = 1.0 / torch.sqrt(bn.running_var.double() + bn.eps)
    if bn.affine:
        scale = scale * bn.weight.double()
    shift = -bn.running_mean.double() * scale
    if bn.affine:
        shift = shift + bn.bias.double()
    return scale, shift


def fold_conv_bn(conv: nn.Conv1d | nn.Conv2d, bn: nn.modules.batchnorm._BatchNorm) -> tuple[Tensor, Tensor]:
    """Weight and bias of `bn(conv(x))` as one conv, rounded once to the conv's dtype."""
    scale, shift = _bn_scale_shift(bn)
    weight = conv.weight.double() * scale.view(-1, *([1] * (conv.weight.dim() - 1)))
    bias = shift if conv.bias is None else conv.bias.double() * scale + shift
    return weight.to(conv.weight.dtype), bias.to(conv.weight.dtype)


@dataclass
class _Conv2d:
    weight: Tensor
    bias: Tensor
    stride: tuple[int, int]
    padding: tuple[int, int]

    def __call__(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)


@dataclass
class _ResBlock:
    conv1: _Conv2d
    conv2: _Conv2d
    shortcut: _Conv2d | None


@dataclass
class _DenseLayer:
    bn_scale: Tensor  # nonlinear1 as x * scale + shift, [C_in]
    bn_shift: Tensor
    w1: Tensor  # linear1 with nonlinear2 folded, [bn, C_in]
    b1: Tensor
    w_taps: Tensor  # linear_local as [3 * growth, bn]: rows of tap k (frame t - d, t, t + d) at k * growth
    dilation: int
    w_ctx1: Tensor  # cam_layer.linear1 [bn/2, bn]
    b_ctx1: Tensor
    w_ctx2: Tensor  # cam_layer.linear2 [growth, bn/2]
    b_ctx2: Tensor


@dataclass
class _Block:
    in_channels: int
    growth: int
    layers: list[_DenseLayer]


@dataclass
class _Transit:
    bn_scale: Tensor
    bn_shift: Tensor
    weight: Tensor  # [C_out, C_in]
    bias: Tensor | None  # the last transit carries out_nonlinear's BN, followed by ReLU
    relu: bool


def _conv2d(
    conv: nn.Conv2d, bn: nn.modules.batchnorm._BatchNorm, device: torch.device, memory_format: torch.memory_format
) -> _Conv2d:
    weight, bias = fold_conv_bn(conv, bn)
    weight = weight.to(device).contiguous(memory_format=memory_format)
    return _Conv2d(weight, bias.to(device), tuple(conv.stride), tuple(conv.padding))  # type: ignore[arg-type]


class CampplusInference:
    """Callable `[B, T, F]` fp32 features -> `[B, E]` embedding; call it under `torch.inference_mode()`."""

    def __init__(self, model: CAMPPlus, device: torch.device | str = "cpu") -> None:
        if model.training:
            raise ValueError("CampplusInference needs an eval-mode CAMPPlus (call model.eval() first)")
        self.device = torch.device(device)
        self.seg_pool_mode = model.seg_pool_mode
        self.feat_dim = model.feat_dim
        dev = self.device
        # Channels-last head only where it was measured to pay (oneDNN on CPU); accelerator backends
        # keep their default layout (torch_npu in particular has its own internal formats).
        self.head_format = torch.channels_last if dev.type == "cpu" else torch.contiguous_format
        fmt = self.head_format
        head = model.head
        with torch.no_grad():
            self.head_conv1 = _conv2d(head.conv1, head.bn1, dev, fmt)
            self.head_blocks: list[_ResBlock] = []
            for layer in (head.layer1, head.layer2):
                for block in layer:
                    assert isinstance(block, BasicResBlock)
                    shortcut = _conv2d(block.shortcut[0], block.shortcut[1], dev, fmt) if len(block.shortcut) else None
                    self.head_blocks.append(
                        _ResBlock(
                            _conv2d(block.conv1, block.bn1, dev, fmt),
                            _conv2d(block.conv2, block.bn2, dev, fmt),
                            shortcut,
                        )
                    )
            self.head_conv2 = _conv2d(head.conv2, head.bn2, dev, fmt)

            xv = model.xvector
            tdnn_w, tdnn_b = fold_conv_bn(xv.tdnn.linear, xv.tdnn.nonlinear.batchnorm)
            self.tdnn = (tdnn_w.to(dev), tdnn_b.to(dev), xv.tdnn.linear.stride[0], xv.tdnn.linear.padding[0])
            self.stages: list[_Block | _Transit] = []
            transits = [name for name, m in xv.named_children() if isinstance(m, TransitLayer)]
            for name, module in xv.named_children():
                if isinstance(module, CAMDenseTDNNBlock):
                    self.stages.append(self._block(module, dev))
                elif isinstance(module, TransitLayer):
                    scale, shift = _bn_scale_shift(module.nonlinear.batchnorm)
                    if name == transits[-1]:
                        weight, bias = fold_conv_bn(module.linear, xv.out_nonlinear.batchnorm)
                        out_bias: Tensor | None = bias.to(dev)
                    else:
                        weight, out_bias = module.linear.weight, None
                    self.stages.append(
                        _Transit(
                            scale.float().to(dev),
                            shift.float().to(dev),
                            weight.detach()[..., 0].contiguous().to(dev),
                            out_bias,
                            relu=name == transits[-1],
                        )
                    )
            dense_w, dense_b = fold_conv_bn(xv.dense.linear, xv.dense.nonlinear.batchnorm)
            self.dense = (dense_w[..., 0].contiguous().to(dev), dense_b.to(dev))

    @staticmethod
    def _block(block: CAMDenseTDNNBlock, dev: torch.device) -> _Block:
        layers = []
        for layer in block:
            scale, shift = _bn_scale_shift(layer.nonlinear1.batchnorm)
            w1, b1 = fold_conv_bn(layer.linear1, layer.nonlinear2.batchnorm)
            cam = layer.cam_layer
            local = cam.linear_local
            if local.bias is not None or local.stride[0] != 1 or local.kernel_size[0] != 3:
                raise ValueError("CampplusInference supports the upstream CAM layer (3 taps, stride 1, no bias)")
            w_taps = local.weight.detach().permute(2, 0, 1).reshape(-1, local.in_channels)
            layers.append(
                _DenseLayer(
                    scale.float().to(dev),
                    shift.float().to(dev),
                    w1[..., 0].contiguous().to(dev),
                    b1.to(dev),
                    w_taps.contiguous().to(dev),
                    local.dilation[0],
                    cam.linear1.weight.detach()[..., 0].contiguous().to(dev),
                    cam.linear1.bias.detach().to(dev),
                    cam.linear2.weight.detach()[..., 0].contiguous().to(dev),
                    cam.linear2.bias.detach().to(dev),
                )
            )
        first = next(iter(block))
        return _Block(first.nonlinear1.batchnorm.num_features, first.cam_layer.linear_local.out_channels, layers)

    # -- forward ---------------------------------------------------------------------------------

    def _head(self, feats: Tensor) -> Tensor:
        x = feats.permute(0, 2, 1).unsqueeze(1).contiguous(memory_format=self.head_format)  # [B, 1, F, T]
        x = torch.relu_(self.head_conv1(x))
        for block in self.head_blocks:
            out = torch.relu_(block.conv1(x))
            out = block.conv2(out)
            out += x if block.shortcut is None else block.shortcut(x)
            x = torch.relu_(out)
        x = torch.relu_(self.head_conv2(x))
        b, c, f, t = x.shape
        return x.reshape(b, c * f, t)

    def _segment_divisor(self, frames: int, device: torch.device) -> Tensor | float:
        if self.seg_pool_mode == "legacy" or frames % SEG_LEN == 0:
            return float(SEG_LEN)
        nseg = -(-frames // SEG_LEN)
        div = torch.full((nseg, 1), float(SEG_LEN), dtype=torch.float32, device=device)
        div[-1] = frames - (nseg - 1) * SEG_LEN
        return div

    def _run_block(self, x: Tensor, block: _Block) -> Tensor:
        b, t, c0 = x.shape
        g = block.growth
        buf = torch.empty((b, t, c0 + g * len(block.layers)), dtype=x.dtype, device=x.device)
        buf[..., :c0].copy_(x)
        nseg = -(-t // SEG_LEN)
        pad = nseg * SEG_LEN - t
        divisor = self._segment_divisor(t, x.device)
        single_factor = 1.0 / t + 1.0 / (SEG_LEN if self.seg_pool_mode == "legacy" else t)
        for i, layer in enumerate(block.layers):
            cin = c0 + i * g
            h = torch.addcmul(layer.bn_shift, buf[..., :cin], layer.bn_scale).relu_()
            z = F.linear(h, layer.w1, layer.b1).relu_()  # [B, T, bn]
            # linear_local: y[t] = W0 z[t - d] + W1 z[t] + W2 z[t + d] (zero outside); one GEMM gives
            # every tap of every frame, two shifted in-place adds place them in the block buffer.
            taps = F.linear(z, layer.w_taps)  # [B, T, 3g]
            out = buf[..., cin : cin + g]
            out.copy_(taps[..., g : 2 * g])
            d = layer.dilation
            if d < t:
                out[:, d:] += taps[:, : t - d, :g]
                out[:, : t - d] += taps[:, d:, 2 * g :]
            if nseg == 1:
                # utterance mean + the one segment's mean: one reduction, one combined factor
                ctx = z.sum(dim=1, keepdim=True).mul_(single_factor)
            else:
                seg_sum = (F.pad(z, (0, 0, 0, pad)) if pad else z).view(b, nseg, SEG_LEN, -1).sum(dim=2)
                ctx = seg_sum / divisor + seg_sum.sum(dim=1, keepdim=True) / t  # [B, nseg, bn]
            gate = torch.sigmoid(
                F.linear(F.linear(ctx, layer.w_ctx1, layer.b_ctx1).relu_(), layer.w_ctx2, layer.b_ctx2)
            )
            out.mul_(gate.repeat_interleave(SEG_LEN, dim=1)[:, :t] if nseg > 1 else gate)
        return buf

    def __call__(self, feats: Tensor) -> Tensor:
        x = self._head(feats)
        w, bias, stride, padding = self.tdnn
        x = F.conv1d(x, w, bias, stride=stride, padding=padding).relu_()  # [B, C, T']
        x = x.transpose(1, 2)  # [B, T', C]
        for stage in self.stages:
            if isinstance(stage, _Block):
                x = self._run_block(x, stage)
            else:
                h = torch.addcmul(stage.bn_shift, x, stage.bn_scale).relu_()
                x = F.linear(h, stage.weight, stage.bias)
                if stage.relu:
                    x = x.relu_()
        stats = torch.cat((x.mean(dim=1), x.std(dim=1, unbiased=True)), dim=-1)
        return F.linear(stats, *self.dense)
