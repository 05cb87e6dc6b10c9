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
- statistics pooling is two reductions over the time axis (`campplus.pooling`), 7x faster than
  `Tensor.std` over a non-contiguous axis;
- on CPU the FCM head runs channels-last, oneDNN's preferred layout (no reorder around each conv),
  through `torch.mkldnn_convolution` directly (see `_Conv`).

**Padded calls.** `__call__(feats [B, T, F], lengths [B])` treats frames at and beyond
`lengths[b]` of row b as padding and returns exactly the embedding of the unpadded rows: every
conv that mixes frames sees zeros there, and every pooling counts valid frames only (the rules
and why are in `campplus.masking`). Shapes depend on B and T only and nothing reads `lengths` on
the host, so the call can be captured in a CUDA / NPU graph per (frame bucket, batch bucket).
An unpadded call (`lengths=None`) runs the same reductions without masks, so on the CPU a
padded row equals its unpadded call to the last bit (`tests/.../test_campplus_padding.py`).

Validated against `CAMPPlus.forward` and onnxruntime (tests/model_executor/models/speaker_embedding/campplus).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.dtdnn import CAMPPlus
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.layers import (
    BasicResBlock,
    CAMDenseTDNNBlock,
    TransitLayer,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.masking import (
    FrameInfo,
    check_lengths,
    mask_,
    masked,
    pooled_frames,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.pooling import (
    cam_context,
    frames_of_segments,
    statistics,
)

Tensor = torch.Tensor

#: On CPU a row's GEMM result must not depend on how many rows its call has, or a padded call
#: would differ from the unpadded one. MKL computes 1 row (GEMV) and 2-3 rows with kernels that
#: round differently from its blocked kernel, and with 2 or 8 threads it splits 5-7 and 9-11 rows
#: so that a thread gets such a remainder; ATen's vectorised sigmoid computes the tail past the
#: last full 2 x 16 lanes with scalar code that rounds differently. Row counts that are multiples
#: of ROW_MULTIPLE, and any count >= MIN_FRAME_ROWS, were row-stable with 1, 2, 3, 4 and 8 threads
#: (torch 2.13, MKL 2024.2). So the per-segment / per-utterance GEMMs (CAM gate MLP, final dense)
#: round their rows up to a multiple of ROW_MULTIPLE, and calls with fewer than MIN_FRAME_ROWS
#: frame rows (B x T', i.e. single utterances under 0.63 s) run padded to that many.
ROW_MULTIPLE = 4
MIN_FRAME_ROWS = 32


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
class _Conv:
    """A conv with its BN folded in: 2-D (head) or 1-D (TDNN).

    On CPU builds with oneDNN it calls `torch.mkldnn_convolution` directly. aten's conv dispatcher
    sends small inputs (below ~20k elements, e.g. the 1-channel first conv at T <= 256) to a slow
    reference kernel and larger ones to oneDNN, so a frame would be computed by different kernels
    at different T; one kernel for every T is what lets a padded call equal the unpadded one (and
    the first conv runs 3x faster).
    """

    weight: Tensor
    bias: Tensor
    stride: list[int]
    padding: list[int]
    direct: bool

    def __call__(self, x: Tensor) -> Tensor:
        if self.direct:
            dilation = [1] * len(self.stride)
            return torch.mkldnn_convolution(x, self.weight, self.bias, self.padding, self.stride, dilation, 1)
        if x.dim() == 4:
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding)


@dataclass
class _ResBlock:
    conv1: _Conv
    conv2: _Conv
    shortcut: _Conv | None


@dataclass
class _DenseLayer:
    bn_scale: Tensor  # nonlinear1 as x * scale + shift, [C_in]
    bn_shift: Tensor
    # GEMM weights are stored transposed ([in, out], contiguous) for `torch.addmm(bias, x, w)`.
    w1: Tensor  # linear1 with nonlinear2 folded, [C_in, bn]
    b1: Tensor
    w_taps: Tensor  # linear_local as [bn, 3 * growth]: columns of tap k (frame t - d, t, t + d) at k * growth
    dilation: int
    w_ctx1: Tensor  # cam_layer.linear1 [bn, bn/2]
    b_ctx1: Tensor
    w_ctx2: Tensor  # cam_layer.linear2 [bn/2, growth]
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
    weight: Tensor  # [C_in, C_out] (transposed for addmm / mm)
    bias: Tensor | None  # the last transit carries out_nonlinear's BN, followed by ReLU
    relu: bool


def _conv(
    conv: nn.Conv1d | nn.Conv2d,
    bn: nn.modules.batchnorm._BatchNorm,
    device: torch.device,
    memory_format: torch.memory_format,
    direct: bool,
) -> _Conv:
    weight, bias = fold_conv_bn(conv, bn)
    weight = weight.to(device)
    if weight.dim() == 4:
        weight = weight.contiguous(memory_format=memory_format)
    return _Conv(weight, bias.to(device), list(conv.stride), list(conv.padding), direct)  # type: ignore[arg-type]


class CampplusInference:
    """Callable `[B, T, F]` fp32 features (+ optional `lengths` [B]) -> `[B, E]` embedding.

    Call it under `torch.inference_mode()` (or `no_grad`); see the module docstring for padded calls.
    """

    def __init__(self, model: CAMPPlus, device: torch.device | str = "cpu") -> None:
        if model.training:
            raise ValueError("CampplusInference needs an eval-mode CAMPPlus (call model.eval() first)")
        self.device = torch.device(device)
        self.seg_pool_mode = model.seg_pool_mode
        self.feat_dim = model.feat_dim
        self.embedding_size = model.embedding_size
        dev = self.device
        cpu = dev.type == "cpu"
        # Channels-last head only where it was measured to pay (oneDNN on CPU); accelerator backends
        # keep their default layout (torch_npu in particular has its own internal formats).
        self.head_format = torch.channels_last if cpu else torch.contiguous_format
        direct = cpu and torch.backends.mkldnn.is_available()
        self.row_multiple = ROW_MULTIPLE if cpu else 1
        self.min_frame_rows = MIN_FRAME_ROWS if cpu else 1
        # Time reductions accumulate in float64 on CPU so that padding cannot regroup them (see
        # `campplus.pooling`); accelerators keep fp32 (NPUs have no fast float64 reductions).
        self.acc_dtype: torch.dtype | None = torch.float64 if cpu else None
        fmt = self.head_format
        head = model.head
        with torch.no_grad():
            self.head_conv1 = _conv(head.conv1, head.bn1, dev, fmt, direct)
            self.head_blocks: list[_ResBlock] = []
            for layer in (head.layer1, head.layer2):
                for block in layer:
                    assert isinstance(block, BasicResBlock)
                    shortcut = None
                    if len(block.shortcut):
                        shortcut = _conv(block.shortcut[0], block.shortcut[1], dev, fmt, direct)
                    self.head_blocks.append(
                        _ResBlock(
                            _conv(block.conv1, block.bn1, dev, fmt, direct),
                            _conv(block.conv2, block.bn2, dev, fmt, direct),
                            shortcut,
                        )
                    )
            self.head_conv2 = _conv(head.conv2, head.bn2, dev, fmt, direct)

            xv = model.xvector
            self.tdnn = _conv(xv.tdnn.linear, xv.tdnn.nonlinear.batchnorm, dev, fmt, direct)
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
                            weight.detach()[..., 0].t().contiguous().to(dev),
                            out_bias,
                            relu=name == transits[-1],
                        )
                    )
            self.ctx_channels = next(s for s in self.stages if isinstance(s, _Block)).layers[0].w_ctx1.shape[0]
            dense_w, dense_b = fold_conv_bn(xv.dense.linear, xv.dense.nonlinear.batchnorm)
            self.dense = (dense_w[..., 0].t().contiguous().to(dev), dense_b.to(dev))  # [C, E], [E]

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
            w_taps = local.weight.detach().permute(1, 2, 0).reshape(local.in_channels, -1)
            layers.append(
                _DenseLayer(
                    scale.float().to(dev),
                    shift.float().to(dev),
                    w1[..., 0].t().contiguous().to(dev),
                    b1.to(dev),
                    w_taps.contiguous().to(dev),
                    local.dilation[0],
                    cam.linear1.weight.detach()[..., 0].t().contiguous().to(dev),
                    cam.linear1.bias.detach().to(dev),
                    cam.linear2.weight.detach()[..., 0].t().contiguous().to(dev),
                    cam.linear2.bias.detach().to(dev),
                )
            )
        first = next(iter(block))
        return _Block(first.nonlinear1.batchnorm.num_features, first.cam_layer.linear_local.out_channels, layers)

    # -- forward ---------------------------------------------------------------------------------

    def __call__(self, feats: Tensor, lengths: Tensor | None = None) -> Tensor:
        """`feats` [B, T, F] -> [B, E]; with `lengths` [B] (int), frames >= lengths[b] of row b are padding.

        The values of `lengths` must lie in [MIN_FRAMES, T]; only their shape is checked here, the
        values where the lengths are built (`masking.check_lengths`, as `CampplusTorch` does).
        """
        if feats.dim() != 3 or feats.shape[-1] != self.feat_dim:
            raise ValueError(f"CAM++ features must be [B, T, {self.feat_dim}], got {list(feats.shape)}")
        batch, frames, _ = feats.shape
        if lengths is not None:
            # Shapes only: this is the body graphs capture, where nothing may be read on the host.
            # `CampplusTorch` checks the values where it builds the lengths (`check_lengths`).
            check_lengths(lengths, frames, batch, values=False)
        if batch * pooled_frames(frames) < self.min_frame_rows:
            # A tiny call runs padded to >= MIN_FRAME_ROWS frame rows, a multiple of ROW_MULTIPLE (see there).
            if lengths is None:
                lengths = torch.full((batch,), frames, dtype=torch.int64)
            rows = -(-self.min_frame_rows // batch)
            target = 2 * (-(-rows // self.row_multiple) * self.row_multiple)
            feats = F.pad(feats, (0, 0, 0, target - frames))
            frames = target
        if lengths is None:
            info = FrameInfo.dense(batch, frames, self.seg_pool_mode, feats.device, feats.dtype, self.acc_dtype)
        else:
            lengths = lengths.to(feats.device, non_blocking=True)
            info = FrameInfo.padded(lengths, frames, self.seg_pool_mode, feats.dtype, self.acc_dtype)
        x = self._head(feats, info)
        x = self.tdnn(mask_(x, None if info.input_mask is None else info.input_mask[:, 0])).relu_()  # [B, C, T']
        # The dense blocks and transits run on 2-D [B * T', C] (time-major, one GEMM per 1x1 conv).
        x = x.transpose(1, 2)  # [B, T', C] view; the first block copies it into its buffer
        pooled_mask = None if info.pooled_mask is None else info.pooled_mask.reshape(batch * info.pooled, 1)
        # The CAM context of every layer, one row per (utterance, segment), rows rounded up to a
        # multiple of `row_multiple` (zero rows); layers run one after another, so they share it.
        rows = batch * info.segments
        ctx_rows = torch.zeros((rows + -rows % self.row_multiple, self.ctx_channels), dtype=x.dtype, device=x.device)
        for stage in self.stages:
            if isinstance(stage, _Block):
                x = self._run_block(x.reshape(batch, info.pooled, -1), stage, info, pooled_mask, ctx_rows)
            else:
                x = self._transit(x, stage)
        stats = statistics(x.view(batch, info.pooled, -1), info, self._mask3(pooled_mask, batch), 1, self.acc_dtype)
        dense_w, dense_b = self.dense
        return torch.addmm(dense_b, self._padded_rows(stats), dense_w)[:batch]

    @staticmethod
    def _mask3(mask: Tensor | None, batch: int) -> Tensor | None:
        return None if mask is None else mask.view(batch, -1, 1)

    def _padded_rows(self, x: Tensor) -> Tensor:
        """2-D `x` with its row count rounded up to a multiple of `row_multiple` (zero rows appended)."""
        pad = -x.shape[0] % self.row_multiple
        return F.pad(x, (0, 0, 0, pad)) if pad else x

    def _transit(self, x: Tensor, stage: _Transit) -> Tensor:
        """BN + ReLU, 1x1 conv (+ the folded out_nonlinear BN and ReLU after the last one) on [B * T', C]."""
        h = torch.addcmul(stage.bn_shift, x, stage.bn_scale).relu_()
        if stage.bias is None:
            return torch.mm(h, stage.weight)
        x = torch.addmm(stage.bias, h, stage.weight)
        return x.relu_() if stage.relu else x

    def _head(self, feats: Tensor, info: FrameInfo) -> Tensor:
        mask = info.input_mask  # [B, 1, 1, T]: every conv below mixes frames, so its input is masked
        x = masked(feats.permute(0, 2, 1).unsqueeze(1), mask).contiguous(memory_format=self.head_format)
        x = torch.relu_(self.head_conv1(x))
        for block in self.head_blocks:
            x = mask_(x, mask)
            out = mask_(torch.relu_(block.conv1(x)), mask)
            out = block.conv2(out)
            out += x if block.shortcut is None else block.shortcut(x)
            x = torch.relu_(out)
        x = torch.relu_(self.head_conv2(mask_(x, mask)))
        b, c, f, t = x.shape
        return x.reshape(b, c * f, t)

    def _run_block(
        self, x: Tensor, block: _Block, info: FrameInfo, pooled_mask: Tensor | None, ctx_rows: Tensor
    ) -> Tensor:
        """One dense block on `x` [B, T', C0] -> its buffer [B * T', C0 + L * growth] (2-D, time-major)."""
        b, t, c0 = x.shape
        nseg = info.segments
        rows = b * nseg
        ctx = ctx_rows[:rows].view(b, nseg, -1)
        g = block.growth
        buf = torch.empty((b * t, c0 + g * len(block.layers)), dtype=x.dtype, device=x.device)
        buf[:, :c0].view(b, t, c0).copy_(x)
        acc = self.acc_dtype
        # ~15 ops per layer x 52 layers: the hot loop binds the torch functions it calls.
        addcmul, addmm, mm, sigmoid_ = torch.addcmul, torch.addmm, torch.mm, torch.sigmoid_
        cin = c0
        for layer in block.layers:
            h = addcmul(layer.bn_shift, buf[:, :cin], layer.bn_scale).relu_()
            z = addmm(layer.b1, h, layer.w1).relu_()  # [B * T', bn]
            if pooled_mask is not None:  # z feeds the layer's only frame-mixing ops: zero its padding
                z.mul_(pooled_mask)
            # linear_local: y[t] = W0 z[t - d] + W1 z[t] + W2 z[t + d] (zero outside); one GEMM gives
            # every tap of every frame, two shifted in-place adds place them in the block buffer.
            taps = mm(z, layer.w_taps).view(b, t, 3 * g)
            out = buf[:, cin : cin + g].view(b, t, g)
            out.copy_(taps[..., g : 2 * g])
            d = layer.dilation
            if d < t:  # add_ on the views (`out[...] += ...` would copy each view onto itself again)
                out[:, d:].add_(taps[:, : t - d, :g])
                out[:, : t - d].add_(taps[:, d:, 2 * g :])
            cam_context(z.view(b, t, -1), info, 1, acc, out=ctx)  # [B, nseg, bn] into ctx_rows
            # sigmoid(linear2(relu(linear1(ctx)))) on every row of ctx_rows, padding rows included
            gate = sigmoid_(addmm(layer.b_ctx2, addmm(layer.b_ctx1, ctx_rows, layer.w_ctx1).relu_(), layer.w_ctx2))
            out.mul_(frames_of_segments(gate[:rows].view(b, nseg, g), 1, t))
            cin += g
        return buf
