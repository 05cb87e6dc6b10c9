# SPDX-License-Identifier: Apache-2.0
"""CAMPPlus module tree, stand-in fingerprint, strict ONNX loading and input validation."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.model_executor.models.speaker_embedding.campplus.helpers import (
    max_abs_and_cosine,
    ort_embed,
    ort_session,
    speaker_feats,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_state_dict_has_the_upstream_keys_and_shapes() -> None:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import CAMPPlus

    sd = CAMPPlus().state_dict()
    assert len(sd) == 937
    assert sum(k.endswith("num_batches_tracked") for k in sd) == 122
    assert sum(p.numel() for p in CAMPPlus().parameters()) == 6_848_544
    assert sd["head.layer1.0.shortcut.0.weight"].shape == (32, 32, 1, 1)
    assert sd["xvector.tdnn.linear.weight"].shape == (128, 320, 5)
    assert sd["xvector.block3.tdnnd16.nonlinear1.batchnorm.running_mean"].shape == (992,)
    assert sd["xvector.block1.tdnnd1.cam_layer.linear1.weight"].shape == (64, 128, 1)
    assert sd["xvector.dense.linear.weight"].shape == (192, 1024, 1)
    assert "xvector.dense.nonlinear.batchnorm.weight" not in sd
    assert "head.layer1.1.shortcut.0.weight" not in sd


def test_full_standin_matches_the_real_file_fingerprint(full_standin: Path) -> None:
    graph = onnx.load(str(full_standin)).graph
    floats = [i for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    ops = collections.Counter(n.op_type for n in graph.node)
    assert len(floats) == 617
    assert sum(i.name.startswith("onnx::") for i in floats) == 132
    assert (ops["Conv"], ops["BatchNormalization"], ops["AveragePool"]) == (225, 56, 52)
    assert [i.name for i in graph.input] == ["input"] and [o.name for o in graph.output] == ["output"]


@pytest.mark.parametrize(
    "options",
    [{"opset": o} for o in range(11, 21)] + [{"zero_biases": True}, {"exporter": "dynamo"}],
    ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()),
)
def test_reduced_exports_load_and_match_onnxruntime(options: dict) -> None:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
        CampplusTorch,
        load_campplus_from_onnx,
    )

    path = ensure_standin_campplus_onnx(reduced=True, **options)
    if options.get("zero_biases"):
        assert any(n.op_type == "Identity" for n in onnx.load(str(path)).graph.node)
    backend = CampplusTorch(load_campplus_from_onnx(path, seg_pool_mode="auto"), "cpu")
    session = ort_session(path)
    for frames in (4, 345):
        feats = speaker_feats(frames)
        diff, cos = max_abs_and_cosine(backend(feats).numpy(), ort_embed(session, feats))
        assert diff <= 1e-4 and cos >= 0.999999, (frames, diff, cos)


def test_loaded_tensors_equal_the_exported_model(reduced_standin: Path) -> None:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import build_standin_campplus
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import load_campplus_from_onnx

    source = build_standin_campplus(seed=0, reduced=True).state_dict()
    loaded = load_campplus_from_onnx(reduced_standin).state_dict()
    for key in (
        "xvector.block1.tdnnd1.cam_layer.linear2.bias",
        "xvector.block2.tdnnd1.nonlinear1.batchnorm.running_var",
    ):
        assert torch.equal(source[key], loaded[key]), key


def _tiny_other_network(path: Path) -> Path:
    net = torch.nn.Sequential(torch.nn.Conv1d(80, 16, 3), torch.nn.ReLU(), torch.nn.Conv1d(16, 8, 1)).eval()
    torch.onnx.export(net, (torch.zeros(1, 80, 20),), str(path), dynamo=False, opset_version=17)
    return path


@pytest.mark.parametrize("kind", ["other_network", "garbage", "truncated", "missing", "extra_initializer"])
def test_bad_files_raise_the_dedicated_error(kind: str, tmp_path: Path, reduced_standin: Path) -> None:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
        CampplusOnnxError,
        load_campplus_from_onnx,
    )

    path = tmp_path / "campplus.onnx"
    if kind == "other_network":
        _tiny_other_network(path)
        match = "not a CAM.. export"
    elif kind == "garbage":
        path.write_bytes(bytes(range(256)) * 8)
        match = "campplus.onnx"
    elif kind == "truncated":
        path.write_bytes(reduced_standin.read_bytes()[:50_000])
        match = "campplus.onnx"
    elif kind == "missing":
        match = "not found"
    else:
        model = onnx.load(str(reduced_standin))
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((7, 3), np.float32), "stray.weight"))
        onnx.save(model, str(path))
        match = r"not mapped.*stray\.weight \[7, 3\]"
    with pytest.raises(CampplusOnnxError, match=match):
        load_campplus_from_onnx(path)


@pytest.mark.parametrize(
    ("feat", "match"),
    [
        (torch.zeros(1, 100, 80), "shape"),
        (torch.zeros(100, 40), "80 mel bins"),
        (torch.zeros(3, 80), "T >= 4"),
        (torch.full((100, 80), float("nan")), "NaN"),
        (torch.zeros(100, 80, dtype=torch.int32), "float"),
    ],
)
def test_bad_features_are_rejected(feat: torch.Tensor, match: str) -> None:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import validate_speaker_features

    with pytest.raises(ValueError, match=match):
        validate_speaker_features(feat)


def test_bf16_default_dtype_and_two_threads_give_fp32_models(reduced_standin: Path) -> None:
    import threading

    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import load_campplus_from_onnx

    results: list = []
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what vLLM does while building stages
    try:
        threads = [
            threading.Thread(target=lambda: results.append(load_campplus_from_onnx(reduced_standin))) for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert torch.get_default_dtype() == torch.bfloat16
    finally:
        torch.set_default_dtype(previous)
    assert len(results) == 2
    assert all(p.dtype == torch.float32 for m in results for p in m.parameters())


def test_embed_batch_rows_equal_single_calls_and_cache_keys(reduced_standin: Path, tmp_path: Path) -> None:
    import os
    import shutil
    import threading

    from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as set_

    set_.clear_campplus_cache()
    copy = tmp_path / "campplus.onnx"
    shutil.copy(reduced_standin, copy)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(set_.get_campplus_torch(copy, "cpu"))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(b) for b in got}) == 1
    backend = got[0]
    assert backend.name == "torch-cpu" and backend.device == torch.device("cpu")
    assert set_.get_campplus_torch(copy, torch.device("cpu")) is backend
    feats = [speaker_feats(97), speaker_feats(200), speaker_feats(97, offset=16000)]
    batch = backend.embed_batch(feats)
    for i, f in enumerate(feats):
        torch.testing.assert_close(batch[i : i + 1], backend(f), rtol=0, atol=1e-6)  # padded launch, exact masking
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    assert set_.get_campplus_torch(copy, "cpu") is not backend
    set_.clear_campplus_cache()


# The npu device type only exists once `torch.utils.rename_privateuse1_backend("npu")` ran (what
# torch_npu does on import). That rename is irreversible, so the case runs in a subprocess. The
# fake NPU cannot hold tensors, so the device placement (`CampplusInference`) is replaced by a
# recorder; the parsing of the ONNX file (`load_campplus_from_onnx`) is real and counted.
_NPU_CACHE_SCRIPT = r"""
import json, os, sys, threading, types
import torch
from tests.helpers.fake_npu import FakeNpuModule
torch.utils.rename_privateuse1_backend("npu")
torch.npu = FakeNpuModule(True, count=2)
sys.modules["torch_npu"] = types.ModuleType("torch_npu")
from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as set_

builds, placed = [], []
real_load = set_.load_campplus_from_onnx

def counting_load(path, **kwargs):
    builds.append(str(path))
    threading.Event().wait(0.05)  # widen the race window: late threads must wait, not rebuild
    return real_load(path, **kwargs)

class RecordingPlacement:
    def __init__(self, model, device):
        placed.append(str(device))

set_.load_campplus_from_onnx = counting_load
set_.CampplusInference = RecordingPlacement
path = sys.argv[1]
spellings = ["npu", "npu:0", torch.device("npu", 0)]
got = []
threads = [threading.Thread(target=lambda s=s: got.append(set_.get_campplus_torch(path, s)))
           for s in spellings * 5 + ["npu:0"]]
for t in threads:
    t.start()
for t in threads:
    t.join()
first = got[0]
same_after = [set_.get_campplus_torch(path, s) is first for s in spellings]
other_index = set_.get_campplus_torch(path, "npu:1")
cpu = set_.get_campplus_torch(path, "cpu")
st = os.stat(path)
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
changed = set_.get_campplus_torch(path, torch.device("npu", 0))
print(json.dumps({
    "threads": len(got), "distinct": len({id(b) for b in got}), "same_after": same_after,
    "name": first.name, "device": str(first.device), "other_index": other_index.name,
    "other_is_new": other_index is not first, "cpu": cpu.name, "changed_is_new": changed is not first,
    "builds": len(builds), "placed": placed,
}))
"""


def test_npu_spellings_share_one_cache_entry(reduced_standin: Path, tmp_path: Path) -> None:
    import json
    import os
    import shutil
    import subprocess
    import sys

    repo_root = Path(__file__).resolve().parents[5]
    copy = tmp_path / "campplus.onnx"  # the script touches the file's mtime
    shutil.copy(reduced_standin, copy)
    proc = subprocess.run(
        [sys.executable, "-c", _NPU_CACHE_SCRIPT, str(copy)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo_root,
        env=dict(os.environ, PYTHONPATH=str(repo_root), VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL="WARNING"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "threads": 16,
        "distinct": 1,  # "npu", "npu:0", torch.device("npu", 0) from 16 threads: one entry, built once
        "same_after": [True, True, True],
        "name": "torch-npu:0",
        "device": "npu:0",
        "other_index": "torch-npu:1",
        "other_is_new": True,
        "cpu": "torch-cpu",  # CPU has no index
        "changed_is_new": True,  # a file changed on disk is rebuilt, not served from the cache
        "builds": 4,  # npu:0, npu:1, cpu, npu:0 after the change
        "placed": ["npu:0", "npu:1", "cpu", "npu:0"],
    }
