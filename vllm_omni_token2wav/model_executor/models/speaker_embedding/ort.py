# SPDX-License-Identifier: Apache-2.0
"""The onnxruntime CPU speaker embedding: upstream's behaviour, kept as the lazy fallback.

Upstream Step-Audio2 / CosyVoice build `onnxruntime.InferenceSession(campplus.onnx)` with the
CPUExecutionProvider, graph optimisation ORT_ENABLE_ALL and one intra-op thread. This backend keeps
those settings but builds the session only on the first call, exactly once even when many request
threads arrive together, so that a facade whose device path is installed never pays for it.

onnxruntime runs any graph whose input and output shapes fit, so before the session is built the
file goes through the same structural check as the torch loader (`check_campplus_export`: every
tensor maps onto CAM++ 80 -> 192); another network cannot be served as the speaker model.

Numerics: onnxruntime >= 1.29 averages the last partial 100-frame segment of CAM++'s segment
pooling over the real frame count (as PyTorch does); older runtimes divided by 100 (see
docs/design/speaker_embedding.md). The result is whatever the installed runtime computes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch

from vllm_omni_token2wav.known_files import identify_file
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

EMBEDDING_DIM = 192


class OrtSpeakerEmbedding:
    """`SpeakerEmbeddingBackend` over a CPU onnxruntime session of `campplus.onnx`, built lazily.

    The embedding is computed on the CPU and moved to `device` (the facade's device), so callers
    see the same contract as the device backends.
    """

    def __init__(self, onnx_path: str | Path, device: torch.device, *, intra_op_num_threads: int = 1) -> None:
        if isinstance(intra_op_num_threads, bool) or not isinstance(intra_op_num_threads, int):
            raise ValueError(f"intra_op_num_threads must be an int >= 0, got {intra_op_num_threads!r}")
        if intra_op_num_threads < 0:
            raise ValueError(f"intra_op_num_threads must be >= 0 (0 = onnxruntime default), got {intra_op_num_threads}")
        self.onnx_path = Path(onnx_path)
        self._device = device
        self.intra_op_num_threads = intra_op_num_threads
        self._session: Any = None
        self._input_name = ""
        self._output_name = ""
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return "onnxruntime-cpu"

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def session_built(self) -> bool:
        """Whether the onnxruntime session exists (diagnostics; building happens on first call)."""
        return self._session is not None

    @property
    def session(self) -> Any:
        """The `onnxruntime.InferenceSession`, built on first access (once, under a lock)."""
        session = self._session
        if session is None:
            with self._lock:
                if self._session is None:
                    self._session = self._build_session()
                session = self._session
        return session

    def _build_session(self) -> Any:
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.backend import check_speaker_model_path
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.onnx_import import (
            check_campplus_export,
        )

        check_speaker_model_path(self.onnx_path)
        check_campplus_export(self.onnx_path, feat_dim=80, embedding_size=EMBEDDING_DIM)
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = self.intra_op_num_threads
        start = time.perf_counter()
        try:
            session = onnxruntime.InferenceSession(
                str(self.onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types for bad files
            raise RuntimeError(
                f"{self.onnx_path}: onnxruntime cannot load the speaker model ({type(exc).__name__}: {exc}); "
                "is this the campplus.onnx of a token2wav directory?"
            ) from exc
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if len(inputs) != 1 or not outputs:
            raise ValueError(
                f"{self.onnx_path}: expected one input [B,T,80] and one output [B,{EMBEDDING_DIM}], "
                f"got inputs {[i.name for i in inputs]} and outputs {[o.name for o in outputs]}"
            )
        # Names come from the session: the shipped file says "input"/"output", re-exports may not.
        self._input_name, self._output_name = inputs[0].name, outputs[0].name
        logger.info(
            "built onnxruntime CPU session for %s, %s (%d intra-op threads) in %.1f ms",
            self.onnx_path,
            identify_file(self.onnx_path).describe(),
            self.intra_op_num_threads,
            (time.perf_counter() - start) * 1e3,
        )
        return session

    def __call__(self, feat: torch.Tensor) -> torch.Tensor:
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
            validate_speaker_features,
        )

        validate_speaker_features(feat)
        session = self.session
        batch = feat.detach().to(device="cpu", dtype=torch.float32).contiguous().unsqueeze(0).numpy()
        (out,) = session.run([self._output_name], {self._input_name: batch})
        if tuple(out.shape) != (1, EMBEDDING_DIM):
            raise ValueError(
                f"{self.onnx_path}: output '{self._output_name}' has shape {tuple(out.shape)}, "
                f"expected (1, {EMBEDDING_DIM}); is this a CAM++ export with embedding_size={EMBEDDING_DIM}?"
            )
        return torch.from_numpy(out).to(device=self._device, dtype=torch.float32)

    def __repr__(self) -> str:
        return f"OrtSpeakerEmbedding({str(self.onnx_path)!r}, device={self._device}, built={self.session_built})"
