# SPDX-License-Identifier: Apache-2.0
"""The `machine` section of the device check: what the numbers were measured on.

A device-check JSON is read months later next to others from other hosts; without the device name,
the torch / CUDA / cuDNN / CANN / driver versions, the numeric flags that change fp32 results (TF32),
the CPU and its core count, the numbers cannot be compared. Everything here is best effort: a fact
that cannot be read is recorded as null with no error (a missing `nvidia-smi` is not a failure).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform as py_platform
import shutil
import subprocess
from datetime import datetime, timezone
from glob import glob
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vllm_omni_token2wav.benchmarks.common import cpu_model, load_average, usable_cores

if TYPE_CHECKING:
    from vllm_omni_token2wav.benchmarks.device_check.sections import SectionContext

REPO = Path(__file__).resolve().parents[3]
#: Optional packages whose presence changes what the check can do (recorded with their versions).
PACKAGES = ("numpy", "onnx", "onnxruntime", "yaml", "tensorrt", "soxr", "soundfile", "scipy", "matplotlib", "torch_npu")
_CANN_INFO_GLOBS = (
    "{home}/*-linux/ascend_toolkit_install.info",
    "/usr/local/Ascend/ascend-toolkit/latest/*-linux/ascend_toolkit_install.info",
    "/usr/local/Ascend/cann/*-linux/ascend_toolkit_install.info",
)


def _command(args: list[str], timeout: float = 15.0) -> str | None:
    """stdout of a host tool, or None when it is missing or fails."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    """Version of each optional package, None when it is not importable (found without importing it)."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken install or a module without a spec
            found = False
        if not found:
            versions[name] = None
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # an installed package that fails to import (torch_npu without CANN)
            versions[name] = f"import failed: {type(exc).__name__}"
            continue
        versions[name] = str(getattr(module, "__version__", "installed"))
    return versions


def _torch_facts() -> dict[str, Any]:
    cudnn = torch.backends.cudnn
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "threads": torch.get_num_threads(),
        # fp32 numerics: TF32 convolutions / matmuls change CAM++ results on Ampere and later
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": bool(cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        # torch >= 2.9 spells the same per backend and op; None where this torch has no such attribute
        "cudnn_conv_fp32_precision": getattr(getattr(cudnn, "conv", None), "fp32_precision", None),
    }


def _device_facts(ctx: SectionContext) -> dict[str, Any]:
    device, platform = ctx.device, ctx.platform
    facts: dict[str, Any] = {"platform": platform.device_type, "device": str(device)}
    if device.type == "cpu":
        facts["name"] = cpu_model()
        return facts
    module = platform.device_module()
    facts["name"] = platform.get_device_name(device.index)
    facts["count"] = platform.device_count()
    props_fn = getattr(module, "get_device_properties", None)
    if props_fn is not None:
        props = props_fn(device.index)
        for attr in ("total_memory", "multi_processor_count", "major", "minor", "L2_cache_size"):
            value = getattr(props, attr, None)
            if value is not None:
                facts[attr] = int(value)
    facts["memory"] = platform.memory_stats(device)
    graph_api = platform.device_graph_api()
    facts["graph_api"] = None if graph_api is None else graph_api.name
    return facts


def _driver_facts(device_type: str) -> dict[str, Any]:
    if device_type == "cuda":
        query = "name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit"
        return {
            "nvidia_smi": _command(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"]),
            "fields": query,
        }
    if device_type == "npu":
        info = _command(["npu-smi", "info"])
        return {"npu_smi": None if info is None else "\n".join(info.splitlines()[:12])}
    return {}


def cann_version() -> dict[str, Any]:
    """The CANN toolkit's install record (version lines), as far as the files can be found."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME", "/usr/local/Ascend/ascend-toolkit/latest")
    for pattern in _CANN_INFO_GLOBS:
        for path in sorted(glob(pattern.format(home=home))):
            try:
                lines = Path(path).read_text(errors="replace").splitlines()
            except OSError:
                continue
            return {"file": path, "lines": [line for line in lines if "version" in line.lower()][:6]}
    return {"file": None, "lines": [], "ascend_toolkit_home": os.environ.get("ASCEND_TOOLKIT_HOME")}


def _git_commit() -> str | None:
    if not (REPO / ".git").exists():
        return None
    return _command(["git", "-C", str(REPO), "rev-parse", "HEAD"], timeout=5.0)


def run_machine(ctx: SectionContext) -> None:
    from vllm_omni_token2wav.version import __version__

    r = ctx.result
    r["host"] = {
        "python": py_platform.python_version(),
        "os": f"{py_platform.system()} {py_platform.release()}",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "loadavg": load_average(),
        "timestamp_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    r["torch"] = _torch_facts()
    r["device"] = _device_facts(ctx)
    r["driver"] = _driver_facts(ctx.device.type)
    if ctx.device.type == "npu":
        r["cann"] = cann_version()
    r["packages"] = package_versions()
    r["vllm_omni_token2wav"] = {"version": __version__, "git_commit": _git_commit()}
    r["env"] = {
        key: value
        for key, value in sorted(os.environ.items())
        if key.startswith(("VLLM_OMNI_TOKEN2WAV_", "CUDA_", "ASCEND_", "OMP_", "MKL_")) or key in ("OUT",)
    }
    if r["packages"].get("onnxruntime"):
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import ort_seg_pool_mode

        r["onnxruntime_seg_pool_mode"] = ort_seg_pool_mode()


def render_machine(result: dict[str, Any]) -> list[str]:
    device, torch_facts, host = result["device"], result["torch"], result["host"]
    memory = device.get("total_memory")
    lines = [
        f"device {device['device']}: {device.get('name')}"
        + (f", {memory / 2**30:.0f} GiB" if memory else "")
        + (f", graphs: {device.get('graph_api')}" if device["platform"] != "cpu" else ""),
        f"torch {torch_facts['version']} (CUDA {torch_facts['cuda']}, cuDNN {torch_facts['cudnn']}), "
        f"TF32 conv={torch_facts['cudnn_allow_tf32']} matmul={torch_facts['matmul_allow_tf32']}",
        f"host: {host['cpu']}, {host['usable_cores']}/{host['cpu_count']} cores, load {host['loadavg']}, "
        f"python {host['python']}",
    ]
    smi = result.get("driver", {}).get("nvidia_smi")
    if smi:
        lines.append(f"nvidia-smi: {smi.splitlines()[0]}")
    if result.get("cann", {}).get("lines"):
        lines.append(f"CANN: {'; '.join(result['cann']['lines'])}")
    packages = result.get("packages", {})
    lines.append("packages: " + ", ".join(f"{k} {v}" for k, v in packages.items() if v is not None))
    return lines


__all__ = ["PACKAGES", "cann_version", "package_versions", "render_machine", "run_machine"]
