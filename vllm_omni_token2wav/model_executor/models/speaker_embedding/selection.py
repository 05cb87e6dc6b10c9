# SPDX-License-Identifier: Apache-2.0
"""Which CAM++ speaker-embedding backend a Token2Wav facade gets: the one selection function.

Upstream runs `campplus.onnx` in a CPU onnxruntime session on every request; on Ascend hosts that
costs 120-155 ms per call and blocks the host. This fork can also run the same weights in torch on
the serving device (`torch_backend.py`), or as a TensorRT engine on CUDA (`trt.py`). The Token2Wav
facades never pick a backend themselves: they call `select_speaker_embedding_backend` and hold
whatever it returns behind `SpeakerEmbeddingBackend` (`backend.py`).

The backend modules (`ort.py`, `torch_backend.py`, `graphed.py` = the torch one replayed from device
graphs, built only for the request `"graphed"`, `trt.py`) live next to this one so that "where does the
speaker embedding happen" is answered by reading this folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.speaker_embedding.backend import (
    SpeakerEmbeddingBackend,
    check_speaker_model_path,
)

if TYPE_CHECKING:
    from vllm_omni_token2wav.platforms.interface import DevicePlatform

logger = init_logger(__name__)

BackendRequest = Literal["fallback", "device", "graphed", "tensorrt"]
_REQUESTS: Final = ("fallback", "device", "graphed", "tensorrt")

#: Values of the stage option `token2wav_spk_backend` (`stage_backend_request`).
SPK_BACKEND_OPTIONS: Final = ("auto", "device", "graphed", "tensorrt", "onnxruntime")
_OPTION_REQUEST: Final[dict[str, BackendRequest]] = {
    "device": "device",
    "graphed": "graphed",
    "tensorrt": "tensorrt",
    "onnxruntime": "fallback",
}


def check_spk_backend_option(value: object) -> str:
    """`token2wav_spk_backend` normalised (lower case); ValueError naming the choices otherwise."""
    text = str(value).strip().lower() if value is not None else "auto"
    if text not in SPK_BACKEND_OPTIONS:
        raise ValueError(f"token2wav_spk_backend must be one of {', '.join(SPK_BACKEND_OPTIONS)}, got {value!r}")
    return text


def stage_backend_request(option: str, platform: DevicePlatform) -> BackendRequest:
    """What a serving stage installs for `token2wav_spk_backend` on `platform`: the one serving policy.

    | option        | NPU platform | CUDA platform | CPU platform | why                                     |
    |---------------|--------------|---------------|--------------|-----------------------------------------|
    | `auto`        | `device`     | `device`      | `fallback`   | upstream's CPU onnxruntime session      |
    |               |              |               |              | blocks the host 120-155 ms per request  |
    |               |              |               |              | on accelerator hosts; on a CPU host ORT |
    |               |              |               |              | and torch are level (recorded bench)    |
    | `device`      | `device`     | `device`      | `device`     | as asked (CPU: `CPU_DEVICE_PATH_BACKEND`)|
    | `graphed`     | `graphed`    | `graphed`     | `graphed`    | torch CAM++ replayed from device graphs |
    |               |              |               |              | (eager where the platform has none)     |
    | `tensorrt`    | raises       | `tensorrt`    | raises       | explicit: never falls back              |
    | `onnxruntime` | `fallback`   | `fallback`    | `fallback`   | upstream's behaviour, kept selectable   |

    `fallback` means the lazy onnxruntime backend every facade starts with (nothing is installed).
    The request is then built by `select_speaker_embedding_backend` on the facade's device.
    """
    option = check_spk_backend_option(option)
    if option == "auto":
        return "device" if platform.is_npu() or platform.is_cuda() else "fallback"
    return _OPTION_REQUEST[option]


# The one policy entry that depends on a measurement: which backend `enable_device_spk_embedding()`
# installs when the facade's device is the CPU. "onnxruntime" or "torch".
# The recorded run (`benchmarks/results/spk_embedding_cpu.txt`, `bench spk-embedding --threads 1,2` on the
# 2-core build host, the numbers README.md quotes): torch-cpu / onnxruntime-cpu median 0.91-1.09x at one
# thread and 0.96-1.15x at two threads over T 97-3000, slower at T=97 with either budget, so the CPU keeps
# onnxruntime. The earlier loaded-host runs and the condition for flipping this:
# docs/design/speaker_embedding.md ("CPU policy").
CPU_DEVICE_PATH_BACKEND: Final[Literal["onnxruntime", "torch"]] = "onnxruntime"


def select_speaker_embedding_backend(
    onnx_path: str | Path,
    device: torch.device,
    *,
    request: BackendRequest,
    ort_intra_op_threads: int = 1,
    seg_pool_mode: str = "legacy",
) -> SpeakerEmbeddingBackend:
    """Build the speaker-embedding backend for `request` on the facade's `device`.

    | request      | facade device             | backend (`name`)                    | why                          |
    |--------------|---------------------------|-------------------------------------|------------------------------|
    | `"fallback"` | any                       | ORT CPU (`onnxruntime-cpu`),        | upstream; session built on   |
    |              |                           | result moved to `device`            | first call, never otherwise  |
    | `"device"`   | `npu:N`                   | torch CAM++ (`torch-npu:N`)         | 30-32 ms vs 120-155 ms ORT   |
    |              |                           |                                     | that blocks the host         |
    | `"device"`   | `cuda:N`, tensorrt found  | TensorRT (`tensorrt-cuda:N`)        | ~3.6 ms vs ~50 ms ORT        |
    | `"device"`   | `cuda:N`, no tensorrt     | torch CAM++ (`torch-cuda:N`)        | on the device, no host trip  |
    | `"device"`   | `cpu`                     | `CPU_DEVICE_PATH_BACKEND`           | faster of ORT / torch on CPU |
    |              |                           |                                     | (recorded benchmark)         |
    | `"device"`   | other torch device types  | torch CAM++ (`torch-<type>:N`)      | runs wherever torch runs     |
    | `"graphed"`  | any                       | torch CAM++ replayed from device    | no per-kernel launch cost    |
    |              |                           | graphs (`torch-graphs-<dev>`)       | (eager where no graph API)   |
    | `"tensorrt"` | `cuda:N`, tensorrt found  | TensorRT (`tensorrt-cuda:N`)        | `enable_trt_spk_embedding()` |
    | `"tensorrt"` | otherwise                 | raises `RuntimeError`, with cause   | explicit: never falls back   |

    A device path that cannot be built (missing file, torch loader error, TensorRT build error)
    raises: the caller asked for it explicitly, so falling back to the CPU session would hide the
    problem. `seg_pool_mode` is passed to the torch CAM++ (`"legacy"`: onnxruntime <= 1.28 numerics,
    which the flow models were trained on; `"auto"`: whatever the installed onnxruntime computes, so
    the torch path agrees with the ORT fallback). ORT and TensorRT compute what their runtime does.
    ORT backends (the fallback, and the CPU device path when the policy says
    "onnxruntime") build their session on the first call; torch and TensorRT backends are ready
    when this returns.
    """
    if request not in _REQUESTS:
        raise ValueError(f"speaker-embedding backend request must be one of {_REQUESTS}, got {request!r}")
    onnx_path = Path(onnx_path)
    if request == "fallback":
        return _ort_backend(onnx_path, device, ort_intra_op_threads)
    if request == "graphed":
        from vllm_omni_token2wav.model_executor.models.speaker_embedding import graphed

        check_speaker_model_path(onnx_path)
        return graphed.GraphedCampplus.from_onnx(onnx_path, device, seg_pool_mode=seg_pool_mode)

    from vllm_omni_token2wav.model_executor.models.speaker_embedding import trt

    if request == "tensorrt":
        if device.type != "cuda":
            raise RuntimeError(
                f"TensorRT speaker embedding needs a CUDA device, but the facade runs on {device}; "
                "use enable_device_spk_embedding() for the device path of this platform"
            )
        reason = trt.tensorrt_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"TensorRT speaker embedding requested but {reason}")
        return trt.TrtSpeakerEmbedding(onnx_path, device)

    # request == "device"
    if device.type == "cuda":
        reason = trt.tensorrt_unavailable_reason()
        if reason is None:
            return trt.TrtSpeakerEmbedding(onnx_path, device)
        logger.info_once("speaker embedding: %s; using the torch CAM++ on %s", reason, device)
        return _torch_backend(onnx_path, device, seg_pool_mode)
    if device.type == "cpu" and CPU_DEVICE_PATH_BACKEND == "onnxruntime":
        return _ort_backend(onnx_path, device, ort_intra_op_threads)
    return _torch_backend(onnx_path, device, seg_pool_mode)


def _ort_backend(onnx_path: Path, device: torch.device, threads: int) -> SpeakerEmbeddingBackend:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import ort

    return ort.OrtSpeakerEmbedding(onnx_path, device, intra_op_num_threads=threads)


def _torch_backend(onnx_path: Path, device: torch.device, seg_pool_mode: str) -> SpeakerEmbeddingBackend:
    # Looked up through the module at call time so tests can observe (patch) the loader.
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend

    check_speaker_model_path(onnx_path)
    return torch_backend.get_campplus_torch(onnx_path, device, seg_pool_mode=seg_pool_mode)
