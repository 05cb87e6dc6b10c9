# SPDX-License-Identifier: Apache-2.0
"""Stand-in assets and observers for the Token2Wav facade tests (step_audio2, minicpmo_4_5, cosyvoice3).

- `export_tiny_speaker_onnx`: a few-KB ONNX with CAM++'s I/O contract ([B, T, 80] -> [B, 192]),
  for tests of session handling that do not need CAM++ numerics.
- `make_token2wav_dir`: a token2wav directory whose `campplus.onnx` is the full-size deterministic
  stand-in (`campplus.standin`), plus (`synthesis=True`) the reduced stand-in speech tokenizer, flow
  and HiFT and the stand-in default voices, so the facades and stage models can load and synthesise.
- `SessionCounter`: wraps `onnxruntime.InferenceSession` to count (and record) constructions, so
  laziness is observed through the constructor, not through private fields.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch


class _TinySpeakerNet(torch.nn.Module):
    """mean over time -> Linear(80, 192): deterministic, dynamic in B and T."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1234)
        self.proj = torch.nn.Linear(80, 192, dtype=torch.float32)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn((192, 80), generator=gen, dtype=torch.float32) * 0.1)
            self.proj.bias.copy_(torch.randn((192,), generator=gen, dtype=torch.float32) * 0.1)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.proj(feats.mean(dim=1))


def tiny_speaker_reference(feat: torch.Tensor) -> torch.Tensor:
    """What the tiny ONNX computes for `feat` [T, 80], in float64 torch (independent of onnxruntime)."""
    net = _TinySpeakerNet()
    w, b = net.proj.weight.double(), net.proj.bias.double()
    return (feat.double().mean(dim=0, keepdim=True) @ w.T + b).float()


def export_tiny_speaker_onnx(path: Path, *, input_name: str = "input", output_name: str = "output") -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _TinySpeakerNet().eval(),
            (torch.zeros((1, 50, 80), dtype=torch.float32),),
            str(path),
            dynamo=False,
            input_names=[input_name],
            output_names=[output_name],
            dynamic_axes={input_name: {0: "batch", 1: "frames"}, output_name: {0: "batch"}},
            opset_version=17,
        )
    return path


SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2_25hz.onnx"
SYNTHESIS_FILES = (SPEECH_TOKENIZER_FILE, "flow.yaml", "flow.pt", "hift.pt", "HT_ref_audio.wav", "default_female.wav")


def make_token2wav_dir(
    root: Path, *, campplus: Path | None = None, files: tuple[str, ...] = (), synthesis: bool = False
) -> Path:
    """A token2wav directory at `root`: campplus.onnx (the full stand-in unless given), the reduced
    synthesis stand-ins when `synthesis`, and empty placeholder `files`."""
    from vllm_omni.model_executor.models.campplus.standin import ensure_standin_campplus_onnx

    root.mkdir(parents=True, exist_ok=True)
    source = campplus if campplus is not None else ensure_standin_campplus_onnx()
    os.symlink(source, root / "campplus.onnx")
    if synthesis:
        from vllm_omni.model_executor.models.step_audio2.standin import ensure_standin_token2wav_dir

        standin = ensure_standin_token2wav_dir(reduced=True)
        for name in SYNTHESIS_FILES:
            os.symlink(standin / name, root / name)
    for name in files:
        (root / name).write_bytes(b"")
    return root


class SessionCounter:
    """Replaces `onnxruntime.InferenceSession` with a counting wrapper (install with `monkeypatch`).

    `count` / `calls` are the speaker-model sessions the laziness tests are about; sessions of the
    speech tokenizer (built when the synthesis models load, on CPU) go to `tokenizer_sessions`.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, delay_s: float = 0.0) -> None:
        import onnxruntime

        self._real = onnxruntime.InferenceSession
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self.count = 0
        self.tokenizer_sessions = 0
        self.calls: list[dict[str, Any]] = []
        counter = self

        def constructor(path: str, sess_options: Any = None, providers: Any = None, **kwargs: Any) -> Any:
            with counter._lock:
                if Path(str(path)).name == SPEECH_TOKENIZER_FILE:
                    counter.tokenizer_sessions += 1
                else:
                    counter.count += 1
                    counter.calls.append({"path": path, "sess_options": sess_options, "providers": providers})
            if counter._delay_s:
                threading.Event().wait(counter._delay_s)  # widen the race window for concurrency tests
            return counter._real(path, sess_options=sess_options, providers=providers, **kwargs)

        monkeypatch.setattr(onnxruntime, "InferenceSession", constructor)


def assert_embeddings_close(got: Any, expected: Any, *, rel_l2: float = 1e-3, min_cosine: float = 0.9999) -> None:
    """Compare two [1, 192] embeddings by relative L2 error and cosine.

    The stand-in CAM++ has random weights with calibrated BN statistics, so its raw outputs are unit
    scale (rms 1-2.4) like a trained network's; float32 summation-order differences (ORT graph
    optimisation, thread count, torch vs onnxruntime kernels) still move single elements by 1e-5..4e-5
    (docs/design/speaker_embedding.md, "Tolerances"), so norm-relative tolerances are used.
    """
    a = torch.as_tensor(got).detach().double().reshape(-1)
    b = torch.as_tensor(expected).detach().double().reshape(-1)
    rel = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    assert rel <= rel_l2 and cos >= min_cosine, f"relative L2 error {rel:.2e} (<= {rel_l2}), cosine {cos:.6f}"
