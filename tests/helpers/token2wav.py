# SPDX-License-Identifier: Apache-2.0
"""Stand-in assets and observers for the Token2Wav facade tests (step_audio2, minicpmo_4_5, cosyvoice3).

- `campplus_reference`: what the full-size stand-in `campplus.onnx` computes, evaluated by the in-tree
  torch CAM++ loaded from the same file (an implementation independent of onnxruntime).
- `copy_with_io_names`: a copy of an ONNX file whose graph input/output carry other names.
- `export_other_speaker_net_onnx`: a few-KB ONNX of ANOTHER network with CAM++'s I/O contract
  ([B, T, 80] -> [B, 192]), which every speaker backend must refuse to serve.
- `rewrite_in_place_same_size`: change a CAM++ export's weights inside the same file (same size, same
  inode, mtime put back): the edit a stat-based cache key cannot see.
- `make_token2wav_dir`: a token2wav directory whose `campplus.onnx` is the full-size deterministic
  stand-in (`campplus.standin`), plus (`synthesis=True`) the reduced stand-in speech tokenizer, flow
  and HiFT and the stand-in default voices, so the facades and stage models can load and synthesise;
  `layout="minicpmo-utils-1.0.7"` lays out MiniCPM-o's causal-vocoder variant (config.yaml, causal
  hift.pt, hift_original.pt).
- `SessionCounter`: wraps `onnxruntime.InferenceSession` to count (and record) constructions, so
  laziness is observed through the constructor, not through private fields.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch


class _OtherSpeakerNet(torch.nn.Module):
    """mean over time -> Linear(80, 192): not CAM++, but the same input/output shapes."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1234)
        self.proj = torch.nn.Linear(80, 192, dtype=torch.float32)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn((192, 80), generator=gen, dtype=torch.float32) * 0.1)
            self.proj.bias.copy_(torch.randn((192,), generator=gen, dtype=torch.float32) * 0.1)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.proj(feats.mean(dim=1))


def export_other_speaker_net_onnx(path: Path) -> Path:
    """Export `_OtherSpeakerNet` like a speaker model ([B, T, 80] `input` -> [B, 192] `output`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _OtherSpeakerNet().eval(),
            (torch.zeros((1, 50, 80), dtype=torch.float32),),
            str(path),
            dynamo=False,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch", 1: "frames"}, "output": {0: "batch"}},
            opset_version=17,
        )
    return path


@functools.cache
def _torch_campplus(seg_pool_mode: str) -> Any:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
        CampplusTorch,
        load_campplus_from_onnx,
    )

    return CampplusTorch(load_campplus_from_onnx(ensure_standin_campplus_onnx(), seg_pool_mode=seg_pool_mode), "cpu")


def campplus_reference(feat: torch.Tensor) -> torch.Tensor:
    """Embeddings of the full-size stand-in: [1, 192] for `feat` [T, 80], [B, 192] for [B, T, 80], from the
    in-tree torch CAM++ (fp32) with the installed onnxruntime's segment pooling: what onnxruntime should
    compute, up to fp32 rounding (relative L2 <= 7e-6 on speech features,
    tests/.../speaker_embedding/campplus/parity_floor.py)."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import ort_seg_pool_mode

    model = _torch_campplus(ort_seg_pool_mode())
    if feat.ndim == 2:
        return model(feat)
    return model.embed_batch(list(feat.unbind(0)))


def copy_with_io_names(source: Path, target: Path, *, input_name: str, output_name: str) -> Path:
    """`source` saved as `target` with its graph input and output renamed (a re-export with other names)."""
    import onnx

    model = onnx.load(str(source))
    graph = model.graph
    renames = {graph.input[0].name: input_name, graph.output[0].name: output_name}
    graph.input[0].name, graph.output[0].name = input_name, output_name
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = renames.get(name, name)
        for i, name in enumerate(node.output):
            node.output[i] = renames.get(name, name)
    onnx.save(model, str(target))
    return target


def rewrite_in_place_same_size(path: Path, *, scale: float = 2.0) -> None:
    """Scale `xvector.dense.linear.weight` of the CAM++ export at `path`, writing into the same file
    (same inode and byte size) and restoring its mtime, like `cp --preserve=timestamps` over it."""
    import onnx
    from onnx import numpy_helper

    before = path.stat()
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        if init.name == "xvector.dense.linear.weight":
            init.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(init) * scale).astype("float32"), init.name))
            break
    else:
        raise AssertionError(f"{path}: no xvector.dense.linear.weight initializer")
    data = model.SerializeToString()
    assert len(data) == before.st_size, "the rewrite must keep the file size"
    with path.open("r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2_25hz.onnx"
SYNTHESIS_FILES = (SPEECH_TOKENIZER_FILE, "flow.yaml", "flow.pt", "hift.pt", "HT_ref_audio.wav", "default_female.wav")
#: MiniCPM-o's causal-vocoder layout (minicpmo-utils 1.0.7) adds these to the synthesis files.
CAUSAL_VOCODER_FILES = ("config.yaml", "hift_original.pt")


def make_token2wav_dir(
    root: Path,
    *,
    campplus: Path | None = None,
    files: tuple[str, ...] = (),
    synthesis: bool = False,
    layout: str = "step-audio2",
) -> Path:
    """A token2wav directory at `root`: campplus.onnx (the full stand-in unless given), the reduced
    synthesis stand-ins of `layout` when `synthesis`, and empty placeholder `files`."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    root.mkdir(parents=True, exist_ok=True)
    source = campplus if campplus is not None else ensure_standin_campplus_onnx()
    os.symlink(source, root / "campplus.onnx")
    if synthesis:
        from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import (
            MINICPMO_1_0_7_LAYOUT,
            ensure_standin_token2wav_dir,
        )

        standin = ensure_standin_token2wav_dir(reduced=True, layout=layout)
        extra = CAUSAL_VOCODER_FILES if layout == MINICPMO_1_0_7_LAYOUT else ()
        for name in SYNTHESIS_FILES + extra:
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
