# SPDX-License-Identifier: Apache-2.0
"""Measure the fp32 noise floor behind the CAM++ parity tolerance (a script, not a test).

The parity test compares two fp32 evaluations of the same weights (torch, onnxruntime). How close
they can get is bounded by how far each is from the exact result, so this script also evaluates
the loaded `CAMPPlus` in float64 (the same tensors, `CAMPPlus.forward`) and reports, per T and
seg-pool mode, on the full-size stand-in and the serving transform's features:

- torch - ORT: what `test_campplus_torch_parity.py` asserts (ORT CPU EP, 2 threads, ORT_ENABLE_ALL);
- ORT - fp64 and torch - fp64: each runtime's own rounding error;
- ORT(ENABLE_ALL) - ORT(DISABLE_ALL) and ORT 2 threads - 1 thread: onnxruntime against itself;
- the rms of the raw output (the scale the absolute numbers refer to);
- the same three comparisons as relative L2 errors (||a - b|| / ||b||), and torch's fp64 error over
  onnxruntime's: the scale-free quantities the parity test bounds, against the float32 floor F
  (`helpers.fp32_floor`, printed first): torch - ORT <= sqrt(2) F, torch - fp64 <= max(2 x ORT - fp64, F).

    .venv/bin/python -m tests.model_executor.models.speaker_embedding.campplus.parity_floor [--onnx PATH]

The numbers in docs/design/speaker_embedding.md ("Tolerances") come from this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from tests.model_executor.models.speaker_embedding.campplus.helpers import (
    fp32_floor,
    legacy_reference_model,
    max_abs_and_cosine,
    ort_embed,
    rel_l2,
    speaker_feats,
)

FRAMES = (4, 97, 200, 345, 501, 1000, 3000)


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def _session(model: onnx.ModelProto, threads: int, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = level
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import ort_seg_pool_mode
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
        CampplusTorch,
        load_campplus_from_onnx,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", type=Path, default=None, help="campplus.onnx (default: the full-size stand-in)")
    parser.add_argument("--threads", type=int, default=2, help="torch and ORT intra-op threads (default 2)")
    args = parser.parse_args(argv)
    path = args.onnx or ensure_standin_campplus_onnx(seed=0)
    torch.set_num_threads(args.threads)
    print(f"{path}  onnxruntime {ort.__version__} ({ort_seg_pool_mode()} pooling)  torch {torch.__version__}")
    print(f"float32 floor F = u sqrt(sum of fan-ins) = {fp32_floor(load_campplus_from_onnx(path)):.3e}")
    print(
        "mode   |     T | torch-ORT | cosine       | ORT-fp64 | torch-fp64 | ORT opt-noopt | ORT 2t-1t | rms out"
        " | rL2 torch-ORT | rL2 ORT-fp64 | rL2 torch-fp64 | ratio"
    )
    for mode in ("exact", "legacy"):
        if mode == "exact" and ort_seg_pool_mode() != "exact":
            print("exact  | skipped: the installed onnxruntime pools the legacy way, no exact reference")
            continue
        graph = onnx.load(str(path)) if mode == ort_seg_pool_mode() else legacy_reference_model(path)
        full = _session(graph, args.threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        single = _session(graph, 1, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        plain = _session(graph, args.threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        backend = CampplusTorch(load_campplus_from_onnx(path, seg_pool_mode=mode), "cpu")
        exact64 = load_campplus_from_onnx(path, seg_pool_mode=mode).double()
        for frames in FRAMES:
            feats = speaker_feats(frames)
            ref = ort_embed(full, feats)
            got = backend(feats).numpy()
            with torch.no_grad():
                truth = exact64(feats.double()[None]).numpy()
            diff, cos = max_abs_and_cosine(got, ref)
            ort_err, torch_err = rel_l2(ref, truth), rel_l2(got, truth)
            print(
                f"{mode:6s} | {frames:5d} | {diff:9.2e} | {cos:.10f} | {_max_abs(ref, truth):8.2e} | "
                f"{_max_abs(got, truth):10.2e} | {_max_abs(ref, ort_embed(plain, feats)):13.2e} | "
                f"{_max_abs(ref, ort_embed(single, feats)):9.2e} | {float(np.sqrt((truth**2).mean())):7.2f} | "
                f"{rel_l2(got, ref):13.2e} | {ort_err:12.2e} | {torch_err:14.2e} | {torch_err / ort_err:5.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
