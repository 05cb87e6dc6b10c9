# SPDX-License-Identifier: Apache-2.0
"""The toy CosyVoice3 pipeline's two doors into upstream's talker processes: a stand-in speech tokenizer v3, a recorder.

TESTS AND TOY RUNS ONLY. Nothing in the plugin imports this module, and no entry point, plugin hook or
environment variable of a deployment activates it: it acts only in a process that calls `install()`
(a test's own process) or that starts with the toy's `SITE_DIR` on its `PYTHONPATH`
(`standin/toy/__init__.py`; its `sitecustomize.py` calls `install()`), which only the toy pipeline's tests and
scripts set up for the engine processes they spawn. A user's deployment never has that folder on its path, so
upstream's talker there loads the real tokenizer as it always does.

Why a door is needed: vLLM-Omni 0.30's CosyVoice3 talker computes each request's prompt conditioning in
its multimodal processor (`vllm_omni/model_executor/models/cosyvoice3/cosyvoice3.py` `_ensure_s3_model`), which calls
`s3tokenizer.load_model("speech_tokenizer_v3_25hz")`. That function reads
`$XDG_CACHE_HOME/s3tokenizer/speech_tokenizer_v3_25hz.onnx` only if its SHA-256 is the real export's, and
downloads it otherwise (`s3tokenizer/__init__.py` `_download`): an offline host cannot start the talker,
and no stand-in file can pass the checksum. The processor runs in the process that prepares requests
(`AsyncOmni`'s own, or the API server) and may run in the engine's processes too, so every one of them
needs the same answer:

1. **Stand-in tokenizer.** After `s3tokenizer` is imported, its `load_model` returns, for
   `speech_tokenizer_v3_25hz` only, `standin_s3tokenizer_v3()`: s3tokenizer's own `S3TokenizerV3` at a
   small size (`STANDIN_S3_CONFIG`, 1 block) with seeded weights, so the same audio always yields the same
   ids (25 per second, in [0, 6561), as the real one). Every other name goes to the original function.
2. **Recorder** (only with `RECORD_ENV` set to a folder): upstream's CosyVoice3 producer functions
   (`stage_input_processors/cosyvoice3.py`: `talker2code2wav_async_chunk`, and on the sync path
   `text2flow_full_payload` and `text2flow_token_only`) are wrapped so that each call's result is saved
   (`torch.save` of plain dicts / lists / tensors, one file per call, named `<ns>-<pid>-<function>.pt`)
   before it is returned unchanged. Tests compare it with what our code2wav stage counted.

Both act on import (`vllm_omni_token2wav/import_hooks.py` runs the patch right after the module executes), or at once
if the module is already imported; `uninstall()` restores the originals (a test process that drove a toy
engine undoes its own door afterwards).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from vllm_omni_token2wav.import_hooks import install_after_import, uninstall_after_import
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

#: Set to a folder: the producer functions' results are saved there (see the module docstring).
RECORD_ENV: Final = "VLLM_OMNI_TOKEN2WAV_TOY_RECORD"
S3_MODULE: Final = "s3tokenizer"
S3_V3_NAME: Final = "speech_tokenizer_v3_25hz"
PRODUCER_MODULE: Final = "vllm_omni.model_executor.stage_input_processors.cosyvoice3"
RECORDED_FUNCTIONS: Final = ("talker2code2wav_async_chunk", "text2flow_full_payload", "text2flow_token_only")
STANDIN_S3_SEED: Final = 0


@dataclass(frozen=True)
class StandinS3Config:
    """The stand-in tokenizer's size (s3tokenizer's `ModelConfigV3` fields; 128 mels and the codebook stay)."""

    n_audio_state: int = 128  # s3tokenizer's rotary embedding assumes 64 per head
    n_audio_head: int = 2
    n_audio_layer: int = 1


STANDIN_S3_CONFIG: Final = StandinS3Config()
_MARK: Final = "_vllm_omni_token2wav_toy_door"


def standin_s3tokenizer_v3(seed: int = STANDIN_S3_SEED) -> Any:
    """s3tokenizer's `S3TokenizerV3` at `STANDIN_S3_CONFIG` with weights drawn from `seed` (deterministic, CPU)."""
    import torch
    from s3tokenizer.model_v3 import ModelConfigV3, S3TokenizerV3

    config = ModelConfigV3(
        n_audio_state=STANDIN_S3_CONFIG.n_audio_state,
        n_audio_head=STANDIN_S3_CONFIG.n_audio_head,
        n_audio_layer=STANDIN_S3_CONFIG.n_audio_layer,
    )
    model = S3TokenizerV3(S3_V3_NAME, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict(keep_vars=True).items()):
            if tensor.is_floating_point():
                noise = torch.randn(tensor.shape, generator=generator) * 0.05
                norm_gain = tensor.dim() == 1 and name.endswith("weight")  # LayerNorm gains: near 1
                tensor.copy_(noise + 1.0 if norm_gain else noise)
    return model.eval()


def _patch_s3tokenizer(module: ModuleType) -> None:
    original = module.load_model
    if getattr(original, _MARK, False):
        return

    def load_model(name: str, download_root: str | None = None) -> Any:
        if name == S3_V3_NAME:
            logger.warning("toy run: %s is the seeded stand-in (cosyvoice3_door.py), not the real tokenizer", name)
            return standin_s3tokenizer_v3()
        return original(name, download_root)

    setattr(load_model, _MARK, True)
    load_model.__wrapped__ = original  # type: ignore[attr-defined]
    module.load_model = load_model


_counter_lock = threading.Lock()
_counter = [0]


def _plain(value: Any) -> Any:
    """`value` as dicts / lists / tensors / scalars (msgspec structs and TypedDict prompts unpacked)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    fields = getattr(type(value), "__struct_fields__", None)
    if fields is not None:
        return {f: _plain(getattr(value, f)) for f in fields if getattr(value, f) is not None}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _request_id(function: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """The request a producer call is about: the first source output of `text2flow_token_only(source_outputs,
    prompt, ...)`, else the `request` argument (the async-chunk and full-payload functions' third positional)."""
    if function == "text2flow_token_only":
        outputs = args[0] if args else kwargs.get("source_outputs")
        request = outputs[0] if outputs else None
    else:
        request = args[2] if len(args) > 2 else kwargs.get("request")
    for name in ("external_req_id", "request_id"):
        value = getattr(request, name, None)
        if value is not None:
            return str(value)
    return None


def _recording(function: Callable[..., Any], folder: Path) -> Callable[..., Any]:
    # `functools.wraps` keeps the function's signature visible (`__wrapped__`): upstream's chunk adapter passes
    # `new_token_ids` only to functions whose signature names it or takes **kwargs.
    @functools.wraps(function)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        import torch

        result = function(*args, **kwargs)
        if result is not None:
            with _counter_lock:
                _counter[0] += 1
                n = _counter[0]
            entry = {
                "function": function.__name__,
                "request_id": _request_id(function.__name__, args, kwargs),
                "time": time.time(),
                "result": _plain(result),
            }
            path = folder / f"{time.time_ns()}-{os.getpid()}-{n:06d}-{function.__name__}.pt"
            torch.save(entry, path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
        return result

    setattr(recorded, _MARK, True)
    return recorded


def _patch_producer(module: ModuleType) -> None:
    folder = os.environ.get(RECORD_ENV)
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name in RECORDED_FUNCTIONS:
        function = getattr(module, name, None)
        if function is None:
            continue
        if getattr(function, _MARK, False):
            # Already recording, maybe into another run's folder (a module-scoped engine still alive): wrap the
            # original again for this folder. An engine built earlier keeps the wrapper it resolved at its start.
            function = function.__wrapped__
        setattr(module, name, _recording(function, Path(folder)))


_PATCHES: Final[dict[str, Callable[[ModuleType], None]]] = {
    S3_MODULE: _patch_s3tokenizer,
    PRODUCER_MODULE: _patch_producer,
}


_OWNER = "toy-cosyvoice3-doors"


def install() -> None:
    """Activate both doors in this process (idempotent): patch the modules now, or when they are imported."""
    install_after_import(_OWNER, _PATCHES)


def uninstall() -> None:
    """Undo `install()` in this process: the finder leaves `sys.meta_path`, patched functions get their originals."""
    uninstall_after_import(_OWNER)
    for module_name, names in ((S3_MODULE, ("load_model",)), (PRODUCER_MODULE, RECORDED_FUNCTIONS)):
        module = sys.modules.get(module_name)
        for name in names:
            function = getattr(module, name, None)
            if function is not None and getattr(function, _MARK, False):
                setattr(module, name, function.__wrapped__)


__all__ = [
    "PRODUCER_MODULE",
    "RECORDED_FUNCTIONS",
    "RECORD_ENV",
    "S3_V3_NAME",
    "STANDIN_S3_CONFIG",
    "StandinS3Config",
    "install",
    "standin_s3tokenizer_v3",
    "uninstall",
]
