# SPDX-License-Identifier: Apache-2.0
"""The stage's options, and where each is read from a vLLM `VllmConfig` (read by attribute, never imported).

Every attribute the stage reads, in one table. `extra[...]` is a stage option given in either of two
places of a deploy YAML's stage, the later winning: the connector's `extra` (vLLM-Omni's
`model_config.stage_connector_config["extra"]`), then the stage's `additional_config:` (vLLM's
`vllm_config.additional_config`, a dict). A plain vLLM config has neither and the defaults apply.

| option              | read from                                                               | default          |
|---------------------|-------------------------------------------------------------------------|------------------|
| `model`             | `vllm_config.model_config.model` (a folder, or a hub repo id:           | required         |
|                     | `model_source.py`)                                                      |                  |
| `revision`          | `vllm_config.model_config.revision` (a repo id's branch, tag or commit) | default branch   |
| `token2wav_path`    | `model_config.hf_config.token2wav_path` (Step-Audio2 upstream)          | from `model`     |
| `flow_dtype`        | `extra["token2wav_dtype"]` (auto / float32 / float16 / bfloat16), or    | auto: fp16 on    |
|                     | upstream's `extra["token2wav_float16"]` / `hf_config.token2wav_float16` | CUDA and NPU,    |
|                     | (true: float16, false: float32); `precision.py`. Resolved at the end    | fp32 on CPU      |
|                     | through the platform: never None in the options a stage receives        |                  |
| `device`            | `vllm_config.device_config.device`                                      | platform device  |
| `max_rows`          | `vllm_config.scheduler_config.max_num_seqs` (rows per launch)           | 32               |
| `async_chunk`       | `vllm_config.model_config.async_chunk` (vLLM-Omni: the pipeline streams | False            |
|                     | chunks; a segment without producer payload is then a pre-warm           |                  |
|                     | placeholder, see `contract.py`)                                         |                  |
| `n_timesteps`       | `extra["token2wav_n_timesteps"]`                                        | 10               |
| `reference_seconds` | `extra["ref_audio_max_seconds"]` (MiniCPM-o's name)                     | 6.0              |
| `prompt_wav`        | `extra["prompt_wav"]` (the default voice file)                          | family lookup    |
| `seed`              | `extra["token2wav_seed"]` (NSF noise seeds)                             | 0                |
| `max_streams`       | `extra["token2wav_max_streams"]`: streams live at once; a new stream    | None (no bound)  |
|                     | beyond it waits for admission (a live one is never evicted for it)      |                  |
| `idle_timeout_s`    | `extra["token2wav_stream_idle_timeout_s"]`                              | 600              |
| `memory_budget`     | `extra["token2wav_memory_budget"]`: bytes the live streams may hold (an | auto (None)      |
|                     | int or "8GiB"; "auto": a share of free device memory / available RAM;   |                  |
|                     | "off" / 0: none; `memory_budget.py`)                                    |                  |
| `reserve_seconds`   | `extra["token2wav_stream_reserve_s"]`: audio seconds a new stream       | 0                |
|                     | reserves under the budget beyond its first chunk (streams that grow:    |                  |
|                     | CosyVoice3), at 25 tokens per second                                    |                  |
| `kv_cache_dtype`    | `extra["token2wav_kv_cache_dtype"]` ("bfloat16", "float16", "float32")  | the flow's dtype |
| `pad_to_buckets`    | `extra["token2wav_pad_to_buckets"]` (graph-capture shapes)              | False            |
| `setup_cache_size`  | `extra["token2wav_setup_cache_size"]` (post-prompt flow states kept)    | 4                |
| `batch_vocoder`     | `extra["token2wav_batch_vocoder"]` (CosyVoice3: rows at equal stream    | False            |
|                     | positions share a causal-HiFT launch, ~1e-6 from solo)                  |                  |
| `final_chunk`       | `extra["token2wav_final_chunk"]` (CosyVoice3: how a stream's last chunk | "full_attention" |
|                     | attends: "full_attention" as upstream serves it, or "block_causal")     |                  |
| `device_graphs`     | `extra["token2wav_device_graphs"]` (true / false / auto, `graphs.py`)   | auto (None)      |
| `device_graph_api`  | keyword only: the graph runtime (tests pass a fake)                     | the platform's   |
| `variant`           | `extra["token2wav_variant"]` (MiniCPM-o: "vllm-omni-0.30" or            | the family's     |
|                     | "minicpmo-utils-1.0.7", `minicpmo_4_5/variants.py`)                     |                  |
| `spk_backend`       | `extra["token2wav_spk_backend"]`: auto / device / graphed / tensorrt /  | "auto"           |
|                     | onnxruntime (`speaker_embedding.selection.stage_backend_request`; auto: |                  |
|                     | the device on NPU and CUDA, onnxruntime on CPU)                         |                  |
| `prompt_cache_size` | `extra["token2wav_runtime_prompt_cache_size"]` (MiniCPM-o's name: voice | the core's (16)  |
|                     | prompt features kept, LRU; 0 keeps none)                                |                  |
| (log only)          | `vllm_config.load_config.load_format` (dummy: built on first use)       |                  |

vLLM-Omni 0.30's own code2wav options (`codec_left_context_frames`, `codec_chunk_frames`,
`code2wav_min_batch_size`, `enable_cfm_graph`, `code2wav_bfloat16_attention_cache`, `token2wav_trt`,
the `COSYVOICE3_TRT` / `MINICPMO_TOKEN2WAV_TRT` variables, ...) are checked and mapped onto the rows
above by `upstream_options.read_upstream_options`, per family (what its producer reads): honoured,
mapped, refused with what to use instead, or one warning naming the key. The table of every such
option, where vLLM-Omni reads it and what we do: docs/design/upstream_options.md.

`model_config.dtype` is deliberately not used: vLLM builds stage models under a bf16/fp16 default
dtype, and the token2wav parts are built by explicit dtype: the flow in `flow_dtype`, the rest fp32.
Precedence: keyword arguments given to the stage model (tests, tools) > `additional_config` >
the connector's `extra`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from vllm_omni_token2wav.model_executor.layers.flow.streaming import CACHE_TAIL_FRAMES
from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import check_spk_backend_option
from vllm_omni_token2wav.model_executor.models.token2wav_stage.memory_budget import parse_memory_budget
from vllm_omni_token2wav.model_executor.models.token2wav_stage.precision import (
    parse_flow_dtype,
    requested_flow_dtype,
    resolve_flow_dtype,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.store import DEFAULT_IDLE_TIMEOUT_S
from vllm_omni_token2wav.model_executor.models.token2wav_stage.upstream_options import read_upstream_options
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import (
    DEFAULT_REFERENCE_SECONDS,
    check_reference_seconds,
)
from vllm_omni_token2wav.platforms import DeviceSpec
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM

_KV_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class StageOptions:
    model: Any = None
    revision: str | None = None
    token2wav_path: Any = None
    device: DeviceSpec = None
    flow_dtype: torch.dtype | None = None  # None: auto (`stage_options` resolves it through the platform)
    n_timesteps: int = 10
    reference_seconds: float = DEFAULT_REFERENCE_SECONDS
    prompt_wav: Any = None
    seed: int = 0
    max_rows: int = 32
    max_streams: int | None = None
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    memory_budget: int | None = None  # None: auto (resolved by the stage model); 0: no budget
    reserve_seconds: float = 0.0
    kv_cache_dtype: torch.dtype | None = None
    pad_to_buckets: bool = False
    setup_cache_size: int = 4
    load_format: str | None = None
    batch_vocoder: bool = False
    final_chunk: str = "full_attention"
    device_graphs: bool | None = None
    device_graph_api: Any = FROM_PLATFORM
    variant: str | None = None
    async_chunk: bool = False
    spk_backend: str = "auto"
    # vLLM-Omni's own options mapped onto ours (`upstream_options.py`, docs/design/upstream_options.md).
    prompt_cache_size: int | None = None

    def __post_init__(self) -> None:
        check_reference_seconds(self.reference_seconds)
        object.__setattr__(self, "spk_backend", check_spk_backend_option(self.spk_backend))
        if isinstance(self.n_timesteps, bool) or not isinstance(self.n_timesteps, int) or self.n_timesteps < 1:
            raise ValueError(f"token2wav_n_timesteps must be an int >= 1, got {self.n_timesteps!r}")
        if self.max_rows < 1:
            raise ValueError(f"max_num_seqs (rows per launch) must be >= 1, got {self.max_rows}")
        if self.max_streams is not None and self.max_streams < 1:
            raise ValueError(f"token2wav_max_streams must be >= 1, got {self.max_streams}")
        if not self.reserve_seconds >= 0:  # also NaN
            raise ValueError(
                f"token2wav_stream_reserve_s must be a number of audio seconds >= 0, got {self.reserve_seconds!r}"
            )
        if self.setup_cache_size < 0:
            raise ValueError(f"token2wav_setup_cache_size must be >= 0, got {self.setup_cache_size}")
        if self.prompt_cache_size is not None and self.prompt_cache_size < 0:
            raise ValueError(f"the prompt cache capacity must be >= 0, got {self.prompt_cache_size}")
        if self.final_chunk not in ("block_causal", "full_attention"):
            raise ValueError(
                f"token2wav_final_chunk must be 'block_causal' or 'full_attention', got {self.final_chunk!r}"
            )

    @property
    def float16(self) -> bool:
        """Whether the flow runs in fp16 (upstream's `token2wav_float16`)."""
        return self.flow_dtype == torch.float16

    @property
    def stream_limit(self) -> int | None:
        """Streams admitted at once (None: only the memory budget bounds them). Never a reason to evict a live
        stream: under vLLM-Omni's async-chunk transfer a request leaves the running batch between its chunks, so
        a stage holds a stream per request in flight, up to the client's concurrency, not `max_num_seqs`."""
        return self.max_streams

    @property
    def tail_frames(self) -> int:
        return CACHE_TAIL_FRAMES


def _attr(obj: Any, *path: str) -> Any:
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _extra(vllm_config: Any) -> dict[str, Any]:
    """The `extra[...]` options: the connector's `extra`, then `additional_config` over it (module docstring)."""
    connector = _attr(vllm_config, "model_config", "stage_connector_config")
    if isinstance(connector, Mapping):
        extra = connector.get("extra", connector)
    else:
        extra = getattr(connector, "extra", None)
    merged = dict(extra) if isinstance(extra, Mapping) else {}
    additional = getattr(vllm_config, "additional_config", None)
    # vLLM also allows any hashable object there (a platform's own config): only a dict holds our options.
    return merged | (dict(additional) if isinstance(additional, Mapping) else {})


def kv_dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    if name not in _KV_DTYPES:
        raise ValueError(f"token2wav_kv_cache_dtype must be one of {sorted(_KV_DTYPES)}, got {value!r}")
    return _KV_DTYPES[name]


def graphs_switch(value: Any) -> bool | None:
    """`token2wav_device_graphs`: True / False, None or "auto" (follow the environment and the platform)."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return None
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"token2wav_device_graphs must be true, false or auto, got {value!r}")


def stage_options(vllm_config: Any, overrides: Mapping[str, Any], *, family: str | None = None) -> StageOptions:
    """`StageOptions` from a (real or duck-typed) `VllmConfig`, then `overrides` (see the module table).

    `family` (a `FamilySpec.name`) selects which of vLLM-Omni's producer keys matter (`upstream_options.py`);
    None applies the strictest rules.
    """
    extra = _extra(vllm_config)
    upstream = read_upstream_options(extra, family)
    hf = _attr(vllm_config, "model_config", "hf_config")
    max_rows = _attr(vllm_config, "scheduler_config", "max_num_seqs")
    device = _attr(vllm_config, "device_config", "device")
    values: dict[str, Any] = {
        "model": _attr(vllm_config, "model_config", "model"),
        "revision": _attr(vllm_config, "model_config", "revision"),
        "token2wav_path": getattr(hf, "token2wav_path", None),
        "device": device,
        "flow_dtype": requested_flow_dtype(extra, hf),
        "n_timesteps": int(extra.get("token2wav_n_timesteps", 10)),
        "reference_seconds": float(extra.get("ref_audio_max_seconds", DEFAULT_REFERENCE_SECONDS)),
        "prompt_wav": extra.get("prompt_wav"),
        "seed": int(extra.get("token2wav_seed", 0)),
        "max_rows": int(max_rows) if max_rows else 32,
        "max_streams": int(extra["token2wav_max_streams"]) if "token2wav_max_streams" in extra else None,
        "idle_timeout_s": float(extra.get("token2wav_stream_idle_timeout_s", DEFAULT_IDLE_TIMEOUT_S)),
        "memory_budget": parse_memory_budget(extra.get("token2wav_memory_budget")),
        "reserve_seconds": float(extra.get("token2wav_stream_reserve_s", 0.0)),
        "kv_cache_dtype": kv_dtype(extra.get("token2wav_kv_cache_dtype")),
        "pad_to_buckets": bool(extra.get("token2wav_pad_to_buckets", False)),
        "setup_cache_size": int(extra.get("token2wav_setup_cache_size", 4)),
        "load_format": _attr(vllm_config, "load_config", "load_format"),
        "batch_vocoder": bool(extra.get("token2wav_batch_vocoder", False)),
        "final_chunk": str(extra.get("token2wav_final_chunk", "full_attention")),
        "device_graphs": graphs_switch(extra.get("token2wav_device_graphs")),
        "variant": extra.get("token2wav_variant"),
        "async_chunk": bool(_attr(vllm_config, "model_config", "async_chunk") or False),
        "spk_backend": extra.get("token2wav_spk_backend", "auto"),
    }
    # vLLM-Omni's own options mapped onto ours (device graphs, kv dtype, prompt cache size).
    mapped = dict(upstream.values)
    if "kv_cache_dtype" in mapped:
        mapped["kv_cache_dtype"] = kv_dtype(mapped["kv_cache_dtype"])
    values.update(mapped)
    known = {f.name for f in fields(StageOptions)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown token2wav stage option(s) {unknown}; known: {sorted(known)}")
    options = StageOptions(**values)
    upstream.log()
    convert = {
        "kv_cache_dtype": kv_dtype,
        "device_graphs": graphs_switch,
        "memory_budget": parse_memory_budget,
        "flow_dtype": parse_flow_dtype,
    }
    given = {k: convert[k](v) if k in convert else v for k, v in overrides.items()}
    options = replace(options, **given) if given else options
    # auto follows the serving device's platform (float32 on CPU, reduced precision on CUDA / NPU)
    return replace(options, flow_dtype=resolve_flow_dtype(options.flow_dtype, options.device))


__all__ = ["StageOptions", "graphs_switch", "kv_dtype", "stage_options"]
