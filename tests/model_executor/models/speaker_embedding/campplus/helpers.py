# SPDX-License-Identifier: Apache-2.0
"""Shared pieces of the CAM++ tests: serving-transform inputs and independent onnxruntime references.

`speaker_feats(T)` is what serving feeds CAM++: Kaldi fbank minus its per-utterance mean
(`speaker_embedding.features.speaker_features`) of a deterministic waveform cut from the shipped real speech
clip (tiled when T needs more than its 4 s), so exactly T frames come out.

`fp32_floor(model)` is the relative L2 error a float32 evaluation of a network is expected to reach,
the scale of the CAM++ parity bounds.

`legacy_reference_model(path)` rewrites every AveragePool of an export so that onnxruntime >= 1.29
computes what onnxruntime <= 1.28 computed: the time axis is zero-padded up to a multiple of 100
and pooled without ceil mode, i.e. the last partial segment is divided by 100. That gives the
"legacy" seg-pool mode a reference computed by onnxruntime, not by the code under test.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper

FRAME_LEN = 400  # 25 ms at 16 kHz
FRAME_SHIFT = 160  # 10 ms


@functools.cache
def _speech() -> np.ndarray:
    try:
        from vllm_omni_token2wav.assets.audio import speech_sample

        wav, rate = speech_sample()
        if rate == 16000:
            return wav
    except Exception:  # front end not available: deterministic synthetic "speech"
        pass
    t = np.arange(4 * 16000) / 16000.0
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    wav = 0.3 * np.sin(2 * np.pi * np.cumsum(f0) / 16000.0) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return (wav + 0.01 * np.random.default_rng(0).standard_normal(t.shape)).astype(np.float32)


def waveform_for_frames(frames: int, offset: int = 8000) -> np.ndarray:
    """A deterministic 16 kHz waveform that gives exactly `frames` fbank frames (snip_edges)."""
    n = FRAME_LEN + FRAME_SHIFT * (frames - 1)
    speech = _speech()
    reps = -(-(n + offset) // len(speech))
    return np.tile(speech, reps)[offset : offset + n].copy()


def speaker_feats(frames: int, offset: int = 8000) -> torch.Tensor:
    """float32 [frames, 80]: the serving transform when the audio front end is importable, else
    mean-normalised random features."""
    try:
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features
    except ImportError:
        rng = np.random.default_rng(frames + offset)
        x = rng.standard_normal((frames, 80)).astype(np.float32) * 3.0
        return torch.from_numpy(x - x.mean(axis=0, keepdims=True))
    feats = speaker_features(torch.from_numpy(waveform_for_frames(frames, offset)))
    assert isinstance(feats, torch.Tensor) and feats.shape == (frames, 80), feats.shape
    return feats.float()


def legacy_reference_model(path: Path) -> onnx.ModelProto:
    """The export at `path` with each AveragePool(ceil_mode=1) replaced by zero-pad-to-100 + AveragePool."""
    model = onnx.load(str(path))
    graph = model.graph
    new_nodes = []
    count = 0
    for node in graph.node:
        if node.op_type != "AveragePool":
            new_nodes.append(node)
            continue
        kernel = next(a.ints[0] for a in node.attribute if a.name == "kernel_shape")
        x = node.input[0]
        p = f"legacy_pad{count}"
        count += 1
        consts = {
            f"{p}_two": np.array([2], dtype=np.int64),
            f"{p}_km1": np.array([kernel - 1], dtype=np.int64),
            f"{p}_k": np.array([kernel], dtype=np.int64),
            f"{p}_zeros5": np.zeros(5, dtype=np.int64),
        }
        for name, value in consts.items():
            new_nodes.append(helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name)))
        # pad = ceil(T'/k) * k - T'  with integer ops; pads = [0, 0, 0, 0, 0, pad] for [B, C, T']
        new_nodes += [
            helper.make_node("Shape", [x], [f"{p}_shape"]),
            helper.make_node("Gather", [f"{p}_shape", f"{p}_two"], [f"{p}_t"], axis=0),
            helper.make_node("Add", [f"{p}_t", f"{p}_km1"], [f"{p}_a"]),
            helper.make_node("Div", [f"{p}_a", f"{p}_k"], [f"{p}_n"]),
            helper.make_node("Mul", [f"{p}_n", f"{p}_k"], [f"{p}_full"]),
            helper.make_node("Sub", [f"{p}_full", f"{p}_t"], [f"{p}_amount"]),
            helper.make_node("Concat", [f"{p}_zeros5", f"{p}_amount"], [f"{p}_pads"], axis=0),
            helper.make_node("Pad", [x, f"{p}_pads"], [f"{p}_padded"], mode="constant"),
        ]
        pool = helper.make_node(
            "AveragePool",
            [f"{p}_padded"],
            list(node.output),
            name=node.name,
            kernel_shape=[kernel],
            strides=[kernel],
            ceil_mode=0,
        )
        new_nodes.append(pool)
    assert count > 0, "no AveragePool in the graph"
    del graph.node[:]
    graph.node.extend(new_nodes)
    return model


def ort_session(model: Path | onnx.ModelProto, threads: int = 2) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    data = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])


def ort_embed(session: ort.InferenceSession, feats: torch.Tensor) -> np.ndarray:
    x = feats.detach().cpu().float().numpy()[None]
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def max_abs_and_cosine(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a64, b64 = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    cos = float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))
    return float(np.abs(a64 - b64).max()), cos


def fp32_floor(model: torch.nn.Module) -> float:
    """`u sqrt(sum_l K_l)`: the relative L2 error of a float32 evaluation of `model` (u = 2^-24, K_l = fan-in).

    Probabilistic rounding-error analysis (Higham & Mary, SIAM J. Scientific Computing 41(5), 2019): a float32
    dot product of length K is off by about sqrt(K) u relative to its terms, not by the worst case K u.
    Different kernels (oneDNN, MKL, MLAS, AVX2 or AVX-512 blocking) sum in different orders, so each
    layer's rounding error is an independent draw of that size; the network's normalisations keep the
    gain to its output ~1, so the layers' errors add in quadrature. It counts every Conv / Linear layer
    (weight elements per output channel); full-size CAM++: 225 layers, sum K = 68,457, floor 1.56e-5.
    Measured (docs/design/speaker_embedding.md, "Tolerances"): torch 0.15-0.6x it, onnxruntime 0.1-0.3x.
    """
    fan_in = sum(
        m.weight[0].numel()
        for m in model.modules()
        if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear))
    )
    return 2.0**-24 * math.sqrt(fan_in)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| in float64: the scale-free distance of `a` from the reference `b`."""
    a64, b64 = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(np.linalg.norm(a64 - b64) / np.linalg.norm(b64))
