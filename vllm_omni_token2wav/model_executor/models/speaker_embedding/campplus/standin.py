# SPDX-License-Identifier: Apache-2.0
"""Deterministic stand-in `campplus.onnx` files, exported the way the shipped file was exported.

The real asset cannot be downloaded here, yet the ONNX -> torch loader must be tested on its exact
layout. This module builds the in-tree `CAMPPlus`, fills it with seeded weights (non-zero biases and
BN statistics so that the exporter's Conv+BN fusion is non-trivial), and exports it like the real
file: legacy TorchScript exporter (`dynamo=False`), constant folding, eval mode, input `input`
[B, T, 80], output `output` [B, 192], dynamic batch and T. The full-size legacy export matches the
real file's fingerprint (617 float initializers = 132 anonymous fused + 485 torch-named;
225 Conv, 56 BatchNormalization, 52 AveragePool).

Options: `reduced=True` (narrow and shallow, for fast tests), `opset`, `exporter="dynamo"` (the
torch >= 2.9 default layout, needs onnxscript) and `zero_biases=True` (all biases and BN means
zero, which makes the exporter merge identical initializers behind `Identity` nodes).

Files are cached under `vllm_omni_token2wav.envs.cache_dir("standins", "campplus")`; the name encodes every
option plus the torch version. Writes are atomic (`vllm_omni_token2wav.atomic_io`) and serialised per path by a
thread lock and a cross-process file lock, so concurrent callers build once and never see a
partial file.

    python -m vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin --reduced --opset 13
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch import nn

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.atomic_io import atomic_output, write_bytes_atomic
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.dtdnn import CAMPPlus

logger = init_logger(__name__)

# Bump when the weights or the export recipe change, so stale cached files are not reused.
GENERATOR_VERSION = 2
DEFAULT_OPSET = 17
DEFAULT_DYNAMO_OPSET = 18
LEGACY_OPSETS = tuple(range(11, 21))
EXPORTERS = ("legacy", "dynamo")
REDUCED_CONFIG: dict[str, object] = {
    "embedding_size": 64,
    "growth_rate": 8,
    "bn_size": 2,
    "init_channels": 32,
    "m_channels": 8,
    "block_layers": (2, 3, 2),
}
_EXPORT_FRAMES = 230  # T of the tracing input; any T works (the graph is dynamic in B and T)

# Process-wide: one lock per output path so threads of one process build a given file once.
_path_locks_guard = threading.Lock()
_path_locks: dict[str, threading.Lock] = {}


def _path_lock(path: Path) -> threading.Lock:
    with _path_locks_guard:
        return _path_locks.setdefault(str(path), threading.Lock())


def build_standin_campplus(*, seed: int = 0, reduced: bool = False, zero_biases: bool = False) -> CAMPPlus:
    """The seeded eval-mode CAMPPlus a stand-in file is exported from (fp32, CPU, exact seg-pool)."""
    config = dict(REDUCED_CONFIG) if reduced else {}
    model = CAMPPlus(seg_pool_mode="exact", dtype=torch.float32, **config)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed)

    def uniform(shape: torch.Size, low: float, high: float) -> torch.Tensor:
        return torch.rand(shape, generator=gen, dtype=torch.float32) * (high - low) + low

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv1d | nn.Conv2d):
                fan_in = module.weight[0].numel()
                bound = math.sqrt(6.0 / fan_in)  # Kaiming-uniform for ReLU networks
                module.weight.copy_(uniform(module.weight.shape, -bound, bound))
                if module.bias is not None:
                    module.bias.copy_(
                        torch.zeros_like(module.bias) if zero_biases else uniform(module.bias.shape, -0.2, 0.2)
                    )
            elif isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d) and module.affine:
                module.weight.copy_(uniform(module.weight.shape, 0.6, 1.4))
                module.bias.copy_(
                    torch.zeros_like(module.bias) if zero_biases else uniform(module.bias.shape, -0.3, 0.3)
                )
        # Realistic running statistics: one train-mode pass over fbank-like features, then a seeded
        # perturbation so that eval-mode BN is not the identity on any input.
        bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)]
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: one batch -> its own statistics
        # 32 short "speakers": per-utterance spectral scale and a time envelope give the embedding
        # the across-utterance spread real speakers have; the dense BN normalises by that spread,
        # so a spread that is too small would amplify rounding noise in the raw output.
        utts, frames = 32, 64
        feats = torch.randn((utts, frames, model.feat_dim), generator=gen, dtype=torch.float32)
        feats = feats * torch.exp(0.7 * torch.randn((utts, 1, model.feat_dim), generator=gen, dtype=torch.float32))
        feats = feats * torch.exp(0.5 * torch.randn((utts, frames, 1), generator=gen, dtype=torch.float32)) * 3.0
        feats = feats - feats.mean(dim=1, keepdim=True)
        model.train()
        model(feats)
        model.eval()
        for bn in bns:
            bn.momentum = 0.1
            assert bn.running_mean is not None and bn.running_var is not None
            std = bn.running_var.sqrt()
            if zero_biases:
                bn.running_mean.zero_()
            else:
                bn.running_mean.add_(uniform(std.shape, -0.1, 0.1) * std)
            bn.running_var.mul_(uniform(std.shape, 0.8, 1.25))
            bn.num_batches_tracked.fill_(1000)
    return model.eval()


def standin_path(
    *,
    seed: int = 0,
    reduced: bool = False,
    opset: int | None = None,
    exporter: str = "legacy",
    zero_biases: bool = False,
) -> Path:
    """Where `ensure_standin_campplus_onnx` caches the file for these options (not created here)."""
    opset = _check_options(opset, exporter)
    torch_version = torch.__version__.split("+")[0]
    name = (
        f"campplus-{'reduced' if reduced else 'full'}-seed{seed}-{exporter}-op{opset}"
        f"{'-zerobias' if zero_biases else ''}-g{GENERATOR_VERSION}-torch{torch_version}.onnx"
    )
    return envs.cache_dir("standins", "campplus") / name


def _check_options(opset: int | None, exporter: str) -> int:
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if opset is None:
        return DEFAULT_DYNAMO_OPSET if exporter == "dynamo" else DEFAULT_OPSET
    if exporter == "legacy" and opset not in LEGACY_OPSETS:
        raise ValueError(f"legacy stand-ins are exported at opsets {LEGACY_OPSETS[0]}-{LEGACY_OPSETS[-1]}, got {opset}")
    if exporter == "dynamo" and opset < DEFAULT_DYNAMO_OPSET:
        raise ValueError(f"the dynamo exporter needs opset >= {DEFAULT_DYNAMO_OPSET}, got {opset}")
    return opset


def _export(model: CAMPPlus, path: Path, opset: int, exporter: str) -> None:
    example = torch.zeros((1, _EXPORT_FRAMES, model.feat_dim), dtype=torch.float32)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(
                model,
                (example,),
                str(path),
                dynamo=False,
                export_params=True,
                do_constant_folding=True,
                training=torch.onnx.TrainingMode.EVAL,
                opset_version=opset,
                input_names=["input"],
                output_names=["output"],
                dynamic_axes={"input": {0: "batch_size", 1: "frames"}, "output": {0: "batch_size"}},
            )
        else:
            try:
                import onnxscript  # noqa: F401
            except ImportError as exc:
                raise RuntimeError(
                    "the dynamo stand-in needs onnxscript (pip install onnxscript); it is in the 'dev' extra"
                ) from exc
            batch = torch.export.Dim("batch_size", min=1, max=64)
            frames = torch.export.Dim("frames", min=4, max=100_000)
            program = torch.onnx.export(
                model,
                (example,),
                dynamo=True,
                opset_version=opset,
                input_names=["input"],
                output_names=["output"],
                dynamic_shapes=({0: batch, 1: frames},),
                optimize=True,
                verbose=False,
            )
            program.save(str(path))


def ensure_standin_campplus_onnx(
    *,
    seed: int = 0,
    reduced: bool = False,
    opset: int | None = None,
    exporter: str = "legacy",
    zero_biases: bool = False,
) -> Path:
    """Return the cached stand-in for these options, exporting it first if needed (safe to call concurrently)."""
    path = standin_path(seed=seed, reduced=reduced, opset=opset, exporter=exporter, zero_biases=zero_biases)
    if path.is_file():
        _register(path)
        return path
    with _path_lock(path):
        from filelock import FileLock  # a torch dependency: always installed alongside torch

        with FileLock(str(path) + ".lock"):
            if path.is_file():
                return path
            model = build_standin_campplus(seed=seed, reduced=reduced, zero_biases=zero_biases)
            # atomic_output: umask-respecting mode, and a killed export's temporary is removed next time.
            with atomic_output(path) as tmp:
                try:
                    _export(model, tmp, _check_options(opset, exporter), exporter)
                finally:
                    # the dynamo exporter may write external data next to the file for large models
                    tmp.with_name(tmp.name + ".data").unlink(missing_ok=True)
            logger.info("exported stand-in %s", path)
    _register(path)
    return path


def _register(path: Path) -> None:
    """Record `path` in the stand-in registry (`known_files`) once; the sidecar marks it done."""
    marker = path.with_name(path.name + ".registered")
    if marker.is_file():
        return
    from vllm_omni_token2wav.known_files import record_standin

    record_standin(path, recipe=f"campplus stand-in {path.name}")
    marker.touch()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin",
        description="Export (or find in the cache) a deterministic stand-in campplus.onnx and print its path.",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--reduced", action="store_true", help="narrow/shallow network for fast tests")
    parser.add_argument("--opset", type=int, default=None, help=f"ONNX opset (default {DEFAULT_OPSET}, dynamo 18)")
    parser.add_argument("--exporter", choices=EXPORTERS, default="legacy", help="legacy = layout of the real file")
    parser.add_argument("--zero-biases", action="store_true", help="all-zero biases: exercises Identity aliasing")
    parser.add_argument("--output", type=Path, default=None, help="also copy the file here")
    args = parser.parse_args(argv)
    try:
        path = ensure_standin_campplus_onnx(
            seed=args.seed, reduced=args.reduced, opset=args.opset, exporter=args.exporter, zero_biases=args.zero_biases
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.output is not None:
        write_bytes_atomic(args.output, path.read_bytes())
        path = args.output
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
