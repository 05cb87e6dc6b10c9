# SPDX-License-Identifier: Apache-2.0
"""Device hosts wired end to end: what the plugin installs on a CUDA host, an Ascend host and a CPU host.

Each case runs in a fresh interpreter (registration and the guards patch process-global objects) that
fakes the host before anything of ours is imported: CUDA = `torch.cuda.is_available()` true with one
device and `VLLM_OMNI_TOKEN2WAV_PLATFORM=cuda`; Ascend = a `torch_npu` module, `torch.npu` answering
available, and a `vllm_ascend.compilation.acl_graph` module with an `ACLGraphWrapper` class. Then, as an
engine process does: `plugins.register()` (the entry point), each family's stage class resolved by
upstream's architecture name through vLLM-Omni's `OmniModelRegistry`, and built from a duck-typed
vllm_config on the family's stand-in engine folder with the platform's device.

What each case reports and the test checks:
- which capture guard is on the real `vllm.compilation.cuda_graph.CUDAGraphWrapper.__call__` and on the
  fake `ACLGraphWrapper.__call__` (`graph_capture_guard.is_guarded`);
- which speaker backend each stage installed, for `token2wav_spk_backend` auto / onnxruntime / graphed.
  The torch CAM++ loaders are replaced by recorders (a CPU host cannot place tensors on `cuda:0`), so the
  name is the one `select_speaker_embedding_backend` builds for that device;
- whether device graphs are on for the stage's launches: a `DeviceGraphRunner` on the stage's device with
  the stage's switch (`token2wav_device_graphs`, auto) resolves a graph API (CUDA graphs / ACL graphs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the device-host wiring tests")

_SCRIPT = """
import importlib.machinery, json, os, sys, types
import torch

def fake_module(name):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return module

HOST = sys.argv[1]
if HOST == "cuda":
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_name = lambda index=None: "NVIDIA H100 (fake)"
    os.environ["VLLM_OMNI_TOKEN2WAV_PLATFORM"] = "cuda"
elif HOST == "npu":
    # A fake torch_npu would make transformers and vLLM-Omni take their Ascend paths at import (they
    # import torch_npu's kernels): they are imported first, as on a host where torch_npu is real.
    import transformers.modeling_utils, vllm.config, vllm_omni.model_executor.models.registry  # noqa: F401
    import vllm_omni.model_executor.models.cosyvoice3.cosyvoice3  # noqa: F401
    class FakeNpu(types.ModuleType):
        def is_available(self): return True
        def device_count(self): return 1
        def current_device(self): return 0
        def get_device_name(self, index=None): return "Ascend910B2 (fake)"
        def synchronize(self, device=None): pass
    npu = FakeNpu("torch.npu")
    for name in ("NPUGraph", "graph", "graph_pool_handle", "Stream", "stream", "current_stream", "Event"):
        # torch_npu >= 2.1 has the CUDA graph API under these names; nothing is captured in this test.
        setattr(npu, name, getattr(torch.cuda, "CUDAGraph" if name == "NPUGraph" else name))
    sys.modules["torch_npu"] = fake_module("torch_npu")
    torch.utils.rename_privateuse1_backend("npu")  # what importing torch_npu does: torch.device("npu:0") parses
    torch.npu = npu
    for name in ("vllm_ascend", "vllm_ascend.compilation", "vllm_ascend.compilation.acl_graph"):
        sys.modules[name] = fake_module(name)
    class ACLGraphWrapper:  # the constructor and call shapes the guard's install check expects
        def __init__(self, runnable, vllm_config, runtime_mode, cudagraph_options=None): pass
        def __call__(self, *args, **kwargs): return "stock"
    sys.modules["vllm_ascend.compilation.acl_graph"].ACLGraphWrapper = ACLGraphWrapper
    os.environ["VLLM_OMNI_TOKEN2WAV_PLATFORM"] = "npu"
else:
    os.environ["VLLM_OMNI_TOKEN2WAV_PLATFORM"] = "cpu"

from vllm_omni_token2wav import plugins
plugins.register()

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm_omni_token2wav.platforms import current_omni_platform as platform
from vllm_omni_token2wav.platforms.device_graphs import DeviceGraphRunner
from vllm_omni_token2wav.platforms.graph_capture_guard import is_guarded
from vllm_omni_token2wav.model_executor.models.speaker_embedding import graphed, torch_backend
from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir
from vllm_omni.model_executor.models.registry import OmniModelRegistry

acl = sys.modules.get("vllm_ascend.compilation.acl_graph")
report = {
    "platform": type(platform).__name__,
    "cuda_guard": is_guarded(CUDAGraphWrapper.__call__),
    "acl_guard": None if acl is None else is_guarded(acl.ACLGraphWrapper.__call__),
    "stages": {},
}

class Recorded:
    # Stands for the torch CAM++ on the device: records where it was asked to go.
    def __init__(self, name, device):
        self.name, self.device = name, torch.device(device)
    def __call__(self, feat):
        raise AssertionError("not called in this test")

torch_backend.get_campplus_torch = lambda path, device, **kw: Recorded(f"torch-{device}", device)
graphed.GraphedCampplus.from_onnx = classmethod(
    lambda cls, path, device=None, **kw: Recorded(f"torch-graphs-{device}", device))

device = {"cuda": "cuda:0", "npu": "npu:0", "cpu": "cpu"}[HOST]
ARCH = {"step_audio2": "StepAudio2Token2WavModel", "minicpmo_4_5": "MiniCPMO45Code2Wav",
        "cosyvoice3": "CosyVoice3Model"}
for family, arch in ARCH.items():
    cls = OmniModelRegistry._try_load_model_cls(arch)
    folder = ensure_engine_model_dir(family)
    names = {}
    for option in ("auto", "onnxruntime", "graphed"):
        cfg = types.SimpleNamespace(
            model_config=types.SimpleNamespace(
                model=str(folder), hf_config=None, model_stage="cosyvoice3_code2wav",
                stage_connector_config={"extra": {"token2wav_spk_backend": option}}),
            device_config=types.SimpleNamespace(device=device),
        )
        stage = cls(vllm_config=cfg, prefix="")
        names[option] = stage.spk_backend
        if option == "auto":
            runner = DeviceGraphRunner(lambda x: x, name="probe", device=stage.token2wav.device,
                                       enabled=stage.options.device_graphs)
            report["stages"][family] = {"class": f"{type(stage).__module__}:{type(stage).__name__}",
                                        "graphs": runner.graphs_active, "graph_backend": runner.backend}
    report["stages"][family]["spk"] = names
print(json.dumps(report))
"""

_OURS = "vllm_omni_token2wav.model_executor.models."
_CLASSES = {
    "step_audio2": _OURS + "step_audio2.step_audio2_token2wav_stage:StepAudio2Token2WavForConditionalGeneration",
    "minicpmo_4_5": _OURS + "minicpmo_4_5.minicpmo_4_5_code2wav:MiniCPMO45Code2Wav",
    "cosyvoice3": _OURS + "cosyvoice3.cosyvoice3_code2wav:CosyVoice3Code2Wav",
}


def _wire(host: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_OMNI_TOKEN2WAV_OVERRIDES", "CUDA_VISIBLE_DEVICES")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), host],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL": "INFO"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_cuda_host_gets_the_cuda_capture_guard_device_speaker_embedding_and_graphs() -> None:
    got = _wire("cuda")
    assert got["platform"] == "CudaDevicePlatform"
    assert got["cuda_guard"] is True and got["acl_guard"] is None
    for family, stage in got["stages"].items():
        assert stage["class"] == _CLASSES[family]
        assert stage["spk"] == {
            "auto": "torch-cuda:0",  # no tensorrt here; with it, `tensorrt-cuda:0` (selection table)
            "onnxruntime": "onnxruntime-cpu",
            "graphed": "torch-graphs-cuda:0",
        }, family
        assert stage["graphs"] is True and stage["graph_backend"] == "cuda-graph", family


def test_an_ascend_host_gets_the_acl_capture_guard_device_speaker_embedding_and_graphs() -> None:
    got = _wire("npu")
    assert got["platform"] == "NpuDevicePlatform"
    assert got["acl_guard"] is True and got["cuda_guard"] is False
    for family, stage in got["stages"].items():
        assert stage["class"] == _CLASSES[family]
        assert stage["spk"] == {
            "auto": "torch-npu:0",
            "onnxruntime": "onnxruntime-cpu",
            "graphed": "torch-graphs-npu:0",
        }, family
        assert stage["graphs"] is True, family


def test_a_cpu_host_keeps_onnxruntime_no_guard_and_runs_eagerly() -> None:
    got = _wire("cpu")
    assert got["cuda_guard"] is False and got["acl_guard"] is None
    for family, stage in got["stages"].items():
        assert stage["class"] == _CLASSES[family]
        # CPU policy: onnxruntime (recorded benchmark); `graphed` is selectable and runs eagerly on CPU.
        assert stage["spk"] == {
            "auto": "onnxruntime-cpu",
            "onnxruntime": "onnxruntime-cpu",
            "graphed": "torch-graphs-cpu",
        }
        assert stage["graphs"] is False and stage["graph_backend"] == "eager", family
