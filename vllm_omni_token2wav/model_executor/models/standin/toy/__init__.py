# SPDX-License-Identifier: Apache-2.0
"""Upstream's own multi-stage pipelines at toy size: upstream's thinker/talker classes (random weights) over a
generated model folder, from upstream's own deploy YAMLs, with our code2wav (or upstream's) behind them.

Our stand-in producer (`standin/producer.py`) emits codes through the token stream; it cannot emulate
MiniCPM-o's talker, whose codes travel through its multimodal-output hook. These pipelines run the real
thing: vLLM-Omni's `StepAudio2ThinkerForConditionalGeneration` and `MiniCPMO45OmniForConditionalGeneration`
(thinker + talker) built from a tiny `config.json` with `load_format: dummy`, a tokenizer generated here
(`tokenizer.py`), and the project's stand-in token2wav assets, so a test or a benchmark drives text in ->
audio out through upstream's own stage input processors (`thinker2token2wav[_async_chunk]`, `llm2tts`,
`tts2code2wav_async_chunk`). Facts about what it takes: `shared/notes/upstream-pipelines-cpu.md`.

Deployments are overlays (`base_config:` the YAML shipped in the installed `vllm_omni/deploy/`, never a
copy) changing only:

| key                                       | stages       | why                                                 |
|-------------------------------------------|--------------|-----------------------------------------------------|
| `enforce_eager: true`                     | AR stages    | CUDA graphs do not exist on CPU; torch.compile of   |
|                                           |              | the AR stages takes minutes on 2 cores              |
| `devices: "0"`, `tensor_parallel_size: 1` | every stage  | one CPU device: a 2-device layout fails to bind     |
|                                           |              | its CPU workers / to match the world size           |
| `platforms.cpu.stages[*]`                 | every stage  | the CPU worker otherwise reserves utilisation x     |
| `.kv_cache_memory_bytes: 67108864`        |              | host RAM for its KV cache                           |
| `load_format: dummy`                      | thinker,     | random weights: no checkpoint exists offline        |
|                                           | talker       |                                                     |
| `limit_mm_per_prompt: {image/audio/video: | MiniCPM-o 0, | a text-only folder has no MiniCPM-o processor;      |
| 0}`                                       | 1            | vLLM's multimodal budget would need it              |
| `additional_config.token2wav_n_timesteps: | code2wav     | our stage's fast option (2 Euler steps; the         |
| 2`                                        |              | plumbing under test does not depend on it; upstream |
|                                           |              | 's class reads no `additional_config` key)          |

plus whatever a caller passes as `stage_overrides` (a test's or a benchmark's own knobs, e.g. a served
deployment's reply length). Request lengths are set per request through `sampling_params_list` (built
from the YAML's own `default_sampling_params` with only the length knobs changed, `offline_prompt`):
random weights rarely stop on their own.

`TOY_PIPELINES` maps a family to its `ToyPipeline`; each family's module is imported on first access
(`step_audio2.py`, `minicpmo_4_5.py`, `cosyvoice3.py`; a module that is missing leaves its family out).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CPU_KV_CACHE_BYTES",
    "SITE_DIR",
    "FAST_CODE2WAV_OPTIONS",
    "TOY_PIPELINES",
    "ToyPipeline",
    "site_pythonpath",
    "upstream_deploy_yaml",
    "write_overlay",
]

CPU_KV_CACHE_BYTES = 64 * 1024 * 1024
FAST_CODE2WAV_OPTIONS: dict[str, Any] = {"token2wav_n_timesteps": 2}


#: The folder whose `sitecustomize.py` opens the toy doors (`recorder.py`, `cosyvoice3_door.py`) in every process
#: that starts with it on `PYTHONPATH`: the engine processes a toy run spawns (never a user's deployment).
SITE_DIR = Path(__file__).resolve().with_name("doors_site")


def site_pythonpath(existing: str | None = None) -> str:
    """`PYTHONPATH` with `SITE_DIR` first, then the folder holding this package (so `sitecustomize` imports it)."""
    package_root = Path(__file__).resolve().parents[5]
    parts = [str(SITE_DIR), str(package_root)]
    parts += [p for p in (existing or "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)


def upstream_deploy_yaml(name: str) -> Path:
    """The deploy YAML `name` shipped with the installed vLLM-Omni (`vllm_omni/deploy/<name>`)."""
    spec = importlib.util.find_spec("vllm_omni")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"vllm_omni is not installed: no deploy YAML {name!r} (install vllm-omni 0.30)")
    path = Path(next(iter(spec.submodule_search_locations))) / "deploy" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed vLLM-Omni ships no deploy YAML {name!r}")
    return path


def _yaml(value: Any, indent: int) -> str:
    pad = " " * indent
    if isinstance(value, Mapping):
        return "".join(f"\n{pad}{k}:{_yaml(v, indent + 2)}" for k, v in value.items())
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        out = ""
        for item in value:
            first, *rest = list(item.items())
            out += f"\n{pad}- {first[0]}:{_yaml(first[1], indent + 4)}"
            out += "".join(f"\n{pad}  {k}:{_yaml(v, indent + 4)}" for k, v in rest)
        return out
    return f" {json.dumps(value)}"


def write_overlay(
    path: Path,
    base: Path,
    stages: Mapping[int, Mapping[str, Any]],
    *,
    platforms: Mapping[str, Mapping[int, Mapping[str, Any]]] | None = None,
    top: Mapping[str, Any] | None = None,
) -> Path:
    """`path`: a deploy YAML with `base_config: <base>` and `stages` / `platforms` over it (deep-merged by id),
    plus `top`-level keys (e.g. `async_chunk` where one YAML serves both modes). The one overlay writer of the
    project: the toy pipelines, the engine tests (`tests/e2e/engines.py`) and `bench engine-ab` use it."""

    def stage_list(by_id: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [{"stage_id": sid, **dict(keys)} for sid, keys in sorted(by_id.items())]

    lines = [f"base_config: {json.dumps(str(base))}"]
    lines += [f"{key}:{_yaml(value, 2)}" for key, value in (top or {}).items()]
    lines.append(f"stages:{_yaml(stage_list(stages), 2)}")
    if platforms:
        body = {name: {"stages": stage_list(by_id)} for name, by_id in platforms.items()}
        lines.append(f"platforms:{_yaml(body, 2)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        if isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@runtime_checkable
class ToyPipeline(Protocol):
    """What every family's toy pipeline offers (see the module docstring)."""

    family: str
    #: variant -> deploy YAML file name in `vllm_omni/deploy/` (`"async_chunk"`, `"sync"`)
    upstream_yaml: Mapping[str, str]

    def ensure_model_dir(self, root: Path | None = None) -> Path: ...

    def deployment(
        self,
        model_dir: Path,
        out_dir: Path,
        *,
        async_chunk: bool,
        stage_overrides: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> Path: ...

    def offline_prompt(self, text: str, *, voice: Any = None) -> tuple[dict[str, Any], list[Any]]: ...

    def http_request(self, text: str, *, stream: bool, voice: Any = None) -> tuple[str, dict[str, Any]]: ...


@dataclass(frozen=True)
class UpstreamToyPipeline:
    """The parts of a `ToyPipeline` every token2wav family shares: the overlay and the YAML's sampling defaults.

    `ar_stages` run upstream's thinker/talker (`load_format: dummy`, `enforce_eager`); `code2wav_stage`
    is the stage our class (or upstream's) serves; `stage_keys` are the family's own forced keys.
    """

    family: str
    upstream_yaml: Mapping[str, str]
    ar_stages: tuple[int, ...]
    code2wav_stage: int
    stage_keys: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    #: One YAML serves both modes (CosyVoice3's): the overlay sets the top-level `async_chunk`.
    sets_async_chunk: bool = False

    @property
    def stage_ids(self) -> tuple[int, ...]:
        return (*self.ar_stages, self.code2wav_stage)

    def yaml_name(self, *, async_chunk: bool) -> str:
        variant = "async_chunk" if async_chunk else "sync"
        if variant not in self.upstream_yaml:
            raise ValueError(
                f"{self.family}: upstream ships no {variant} deploy YAML for this toy pipeline; "
                f"variants: {sorted(self.upstream_yaml)}"
            )
        return self.upstream_yaml[variant]

    def forced_stage_keys(self) -> dict[int, dict[str, Any]]:
        """Every key the overlay changes (the module table), before a caller's `stage_overrides`."""
        stages: dict[int, dict[str, Any]] = {}
        for sid in self.stage_ids:
            keys: dict[str, Any] = {"devices": "0", "tensor_parallel_size": 1}
            if sid in self.ar_stages:
                keys |= {"enforce_eager": True, "load_format": "dummy"}
            else:
                keys["additional_config"] = dict(FAST_CODE2WAV_OPTIONS)
            stages[sid] = _merge(keys, self.stage_keys.get(sid, {}))
        return stages

    def deployment(
        self,
        model_dir: Path,
        out_dir: Path,
        *,
        async_chunk: bool,
        stage_overrides: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> Path:
        """`out_dir/<family>_<yaml>`: the overlay over upstream's YAML (`model_dir` is the caller's: the
        deploy YAML names no model folder; pass it to `AsyncOmni(model=...)` / `serve`)."""
        del model_dir  # the YAML does not name the model
        name = self.yaml_name(async_chunk=async_chunk)
        stages = self.forced_stage_keys()
        for sid, keys in (stage_overrides or {}).items():
            stages[sid] = _merge(stages.get(sid, {}), keys)
        platforms = {"cpu": {sid: {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES} for sid in self.stage_ids}}
        if not self.sets_async_chunk:
            return write_overlay(Path(out_dir) / f"toy_{name}", upstream_deploy_yaml(name), stages, platforms=platforms)
        mode = "async_chunk" if async_chunk else "sync"
        return write_overlay(
            Path(out_dir) / f"toy_{mode}_{name}",
            upstream_deploy_yaml(name),
            stages,
            platforms=platforms,
            top={"async_chunk": bool(async_chunk)},
        )

    def default_sampling(self, *, async_chunk: bool = True) -> list[dict[str, Any]]:
        """Each stage's `default_sampling_params` in upstream's YAML (resolved through its `base_config`)."""
        from vllm_omni.config.stage_config import resolve_deploy_yaml

        raw = resolve_deploy_yaml(upstream_deploy_yaml(self.yaml_name(async_chunk=async_chunk)))
        by_id = {int(s["stage_id"]): dict(s.get("default_sampling_params") or {}) for s in raw.get("stages", [])}
        return [by_id.get(sid, {}) for sid in range(max(by_id) + 1)]

    def sampling_params(self, overrides: Sequence[Mapping[str, Any]], *, async_chunk: bool = True) -> list[Any]:
        """`SamplingParams` per stage: upstream's YAML defaults with `overrides[i]` over stage i's."""
        from vllm import SamplingParams

        defaults = self.default_sampling(async_chunk=async_chunk)
        return [SamplingParams(**{**d, **dict(o)}) for d, o in zip(defaults, overrides, strict=True)]


_MODULES = {
    "step_audio2": "vllm_omni_token2wav.model_executor.models.standin.toy.step_audio2",
    "minicpmo_4_5": "vllm_omni_token2wav.model_executor.models.standin.toy.minicpmo_4_5",
    "cosyvoice3": "vllm_omni_token2wav.model_executor.models.standin.toy.cosyvoice3",
}


def _load(family: str) -> ToyPipeline | None:
    try:
        module = importlib.import_module(_MODULES[family])
    except ModuleNotFoundError as exc:
        if exc.name == _MODULES[family]:
            return None  # that family's module is not written (yet)
        raise
    found = getattr(module, "PIPELINE", None)
    if found is None or getattr(found, "family", None) != family:
        raise AttributeError(f"{module.__name__} defines no PIPELINE (the {family} ToyPipeline)")
    return found


class _Registry(Mapping[str, ToyPipeline]):
    """family -> `ToyPipeline`, each module imported on first access."""

    def __init__(self) -> None:
        self._cache: dict[str, ToyPipeline | None] = {}

    def _get(self, family: str) -> ToyPipeline | None:
        if family not in self._cache:
            self._cache[family] = _load(family) if family in _MODULES else None
        return self._cache[family]

    def __getitem__(self, family: str) -> ToyPipeline:
        found = self._get(family)
        if found is None:
            raise KeyError(f"no toy upstream pipeline for {family!r}; available: {sorted(self)}")
        return found

    def __iter__(self) -> Iterator[str]:
        return iter([f for f in _MODULES if self._get(f) is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


TOY_PIPELINES: Mapping[str, ToyPipeline] = _Registry()
