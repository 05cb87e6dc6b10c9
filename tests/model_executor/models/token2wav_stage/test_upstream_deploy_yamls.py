# SPDX-License-Identifier: Apache-2.0
"""Every deploy YAML vLLM-Omni 0.30 ships for our families builds our stage and serves a step, with no engine.

The YAMLs are discovered in the INSTALLED vLLM-Omni (`vllm_omni/deploy/*.yaml`, never a copy): a YAML
belongs to us when one of its pipeline's stages resolves (vLLM-Omni's `OmniModelConfig.architectures`:
the stage's `model_arch`, else the pipeline's) to an architecture in the plugin's `STAGE_OVERRIDES`
(for `CosyVoice3Model`, only its `cosyvoice3_code2wav` stage). The pipeline is the YAML's `pipeline:`
key; a YAML without one is served for the model whose `model_type` the engine reads from the checkpoint,
matched as vLLM-Omni's own last resort matches a model name: the longest registered pipeline key in the
YAML's file name (`step_audio_2_async_chunk.yaml` -> `step_audio_2`).

Per YAML, the stage's `VllmConfig` is derived with vLLM-Omni's own functions, as `StageRuntime` does:
`resolve_omni_config` (YAML + `base_config` + the pipeline) -> `load_omni_transfer_config_for_model`
-> `get_stage_connector_spec` -> `build_engine_args_dict_from_omni_stage_config` -> `build_vllm_config`
(a real `VllmConfig`, `model_config.stage_connector_config` = `{"name", "extra": {..., "stage_id"}}`),
over the family's reduced stand-in engine folder (`standin/model_dirs.py`). A YAML without `pipeline:`
gets a two-line overlay (`base_config:` the installed file, `pipeline:` the key) because the stand-in
folder's `config.json` does not carry the real checkpoint's `model_type`. The class is resolved through
`STAGE_OVERRIDES` by the config's architecture and built as vLLM's loader builds it (under the config's
default dtype); one step (a first chunk when the pipeline streams, a whole utterance otherwise) must
give audio.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine, pytest.mark.usefixtures("cpu_platform")]

require_engine("the upstream deploy YAML tests")

#: Our architecture -> the family whose stand-in folder it is built over (checked against the built stage).
ARCH_FAMILY = {
    "MiniCPMO45Code2Wav": "minicpmo_4_5",
    "StepAudio2Token2WavForConditionalGeneration": "step_audio2",
    "StepAudio2Token2WavModel": "step_audio2",
    "CosyVoice3Model": "cosyvoice3",
}
FAMILIES = ("minicpmo_4_5", "step_audio2", "cosyvoice3")
COSYVOICE3_CODE2WAV_STAGE = "cosyvoice3_code2wav"


@dataclass(frozen=True)
class DeployCase:
    """One installed deploy YAML and the code2wav stage of its pipeline that our plugin serves."""

    yaml: Path
    pipeline: str
    pipeline_from: str  # "yaml" (its `pipeline:` key) or "file name"
    stage_id: int
    arch: str

    @property
    def family(self) -> str:
        return ARCH_FAMILY[self.arch]


def deploy_dir() -> Path:
    import vllm_omni

    return Path(vllm_omni.__file__).parent / "deploy"


def _pipeline_by_name(stem: str, keys: list[str]) -> str | None:
    """vLLM-Omni's last-resort match (`StageConfigFactory._try_infer_model_type`): longest key in the name."""
    name = stem.lower().replace("-", "").replace("_", "")
    found = [k for k in keys if k.lower().replace("-", "").replace("_", "") in name]
    return max(found, key=len) if found else None


def _served_arch(stage: Any, pipeline: Any, overrides: Any) -> str | None:
    """The stage's architecture (`OmniModelConfig.architectures`) if our plugin serves that stage."""
    arch = stage.model_arch or pipeline.model_arch
    if arch not in overrides:
        return None
    if arch == "CosyVoice3Model" and stage.model_stage != COSYVOICE3_CODE2WAV_STAGE:
        return None  # the talker half of the shared class stays upstream's
    return arch


def discover() -> tuple[list[DeployCase], dict[str, str]]:
    """Our stages in every installed deploy YAML, and why each other YAML named like our families is not one."""
    from vllm_omni.config.pipeline_registry import OMNI_PIPELINES, resolve_pipeline_config
    from vllm_omni.config.stage_config import load_deploy_config

    from vllm_omni_token2wav.plugins.overrides import STAGE_OVERRIDES

    cases: list[DeployCase] = []
    skipped: dict[str, str] = {}
    for path in sorted(deploy_dir().glob("*.yaml")):
        try:
            deploy = load_deploy_config(path)
        except Exception as exc:  # some other family's YAML vLLM-Omni itself cannot parse here
            skipped[path.name] = f"vLLM-Omni cannot load it: {type(exc).__name__}"
            continue
        key = deploy.pipeline or _pipeline_by_name(path.stem, list(OMNI_PIPELINES))
        pipeline = resolve_pipeline_config(key, None) if key in OMNI_PIPELINES else None
        if pipeline is None:
            skipped[path.name] = f"no registered pipeline ({key!r})"
            continue
        ours = [(s.stage_id, arch) for s in pipeline.stages if (arch := _served_arch(s, pipeline, STAGE_OVERRIDES))]
        if not ours:
            skipped[path.name] = f"pipeline {key!r} has no stage our plugin serves"
        for stage_id, arch in ours:
            cases.append(DeployCase(path, key, "yaml" if deploy.pipeline else "file name", stage_id, arch))
    return cases, skipped


_CASES, _SKIPPED = discover()


def test_every_family_has_deploy_yamls_and_every_family_named_yaml_is_accounted_for() -> None:
    by_family = {f: sorted(c.yaml.name for c in _CASES if c.family == f) for f in FAMILIES}
    assert all(by_family.values()), f"a family has no installed deploy YAML with our stage: {by_family}"
    # Discovery is by architecture; cross-check it by name: a YAML named for a family is ours or has no code2wav.
    prefixes = {"minicpmo_4_5": "minicpmo_4_5", "step_audio2": "step_audio", "cosyvoice3": "cosyvoice3"}
    for family, prefix in prefixes.items():
        named = sorted(p.name for p in deploy_dir().glob(f"{prefix}*.yaml"))
        for name in named:
            assert name in by_family[family] or "has no stage our plugin serves" in _SKIPPED.get(name, ""), (
                family,
                name,
                _SKIPPED.get(name),
            )
    # What vLLM-Omni 0.30 ships (a new YAML is picked up without editing this list; a lost one fails).
    assert {"minicpmo_4_5.yaml", "minicpmo_4_5_turn.yaml", "minicpmo_4_5_8x4090.yaml"} <= set(by_family["minicpmo_4_5"])
    assert {"step_audio_2.yaml", "step_audio_2_async_chunk.yaml"} <= set(by_family["step_audio2"])
    assert by_family["cosyvoice3"] == ["cosyvoice3.yaml"]
    assert "no stage our plugin serves" in _SKIPPED["step_audio_2_asr.yaml"]  # thinker only (ASR pipeline)


@pytest.fixture(scope="module")
def restored_environment() -> Iterator[None]:
    """vLLM / vLLM-Omni set environment variables and warning filters while building configs: restore them."""
    environ, filters = dict(os.environ), list(warnings.filters)
    yield
    os.environ.clear()
    os.environ.update(environ)
    warnings.filters[:] = filters


def _deploy_path(case: DeployCase, tmp_path: Path) -> Path:
    if case.pipeline_from == "yaml":
        return case.yaml
    overlay = tmp_path / f"{case.yaml.stem}_as_{case.pipeline}.yaml"
    overlay.write_text(f"base_config: {case.yaml}\npipeline: {case.pipeline}\n")
    return overlay


def _stage_vllm_config(case: DeployCase, model: str, tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """The stage's VllmConfig as vLLM-Omni's `StageRuntime` derives it, and the resolved deploy dict."""
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.config.stage_config import resolve_deploy_yaml
    from vllm_omni.engine import stage_init_utils as init

    path = _deploy_path(case, tmp_path)
    resolution = resolve_omni_config(
        model,
        trust_remote_code=None,
        deploy_config_path=str(path),
        cli_overrides={},
        stage_overrides=None,
        strategy_config_path=None,
    )
    stage = resolution.stage_configs[case.stage_id]
    assert stage.stage_id == case.stage_id and stage.model_config.model_arch == case.arch
    transfer = init.load_omni_transfer_config_for_model(model, resolution.config_path)
    spec = init.get_stage_connector_spec(transfer, case.stage_id, stage.connector_config.async_chunk)
    engine_args = init.build_engine_args_dict_from_omni_stage_config(stage, model, stage_connector_spec=spec)
    vllm_config, _ = init.build_vllm_config(stage, model, stage_connector_spec=spec, engine_args_dict=engine_args)
    return vllm_config, resolve_deploy_yaml(path)


def _build_through_overrides(vllm_config: Any) -> Any:
    """Our class for the config's architecture, through the plugin's table, built as vLLM's loader builds it."""
    from vllm.utils.torch_utils import set_default_torch_dtype

    from vllm_omni_token2wav.plugins.overrides import STAGE_OVERRIDES

    arch = vllm_config.model_config.architectures[0]
    module, name = STAGE_OVERRIDES[arch].split(":")
    cls = getattr(importlib.import_module(module), name)
    with set_default_torch_dtype(vllm_config.model_config.dtype):
        return cls(vllm_config=vllm_config, prefix="")


def _one_step(stage: Any, async_chunk: bool) -> torch.Tensor:
    from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import (
        ProducerStream,
        all_chunks,
        forward_inputs,
    )
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors

    tokens = list(range(10, 60))
    if async_chunk:  # the pipeline streams: the producer's first chunk
        prompt = getattr(stage.default_voice, "tokens", None)
        kw = {"prompt_tokens": prompt.shape[1]} if prompt is not None else {}
        input_ids, kwargs = forward_inputs(
            all_chunks(ProducerStream("r0", tokens, stage.family, **kw))[:1], stage.family
        )
    else:  # the sync path: the whole reply's ids, only the runner's bookkeeping in the dict
        input_ids = torch.tensor(tokens, dtype=torch.int32)
        kwargs = {
            "runtime_additional_information": [{"global_request_id": ["r0"], "generated_len": 0}],
            "seq_token_counts": [len(tokens)],
            "request_ids": ["r0"],
        }
    out = stage(input_ids, torch.arange(input_ids.numel()), **kwargs).multimodal_outputs
    assert segment_errors(out) == [None]
    return out[stage.family.output_key][0]  # `audio` for CosyVoice3 (what its pipeline reads), else `model_outputs`


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c.yaml.stem}-stage{c.stage_id}")
def test_the_installed_deploy_yaml_builds_our_stage_and_serves_a_step(
    case: DeployCase, restored_environment: None, tmp_path: Path
) -> None:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

    model = str(ensure_engine_model_dir(case.family))
    vllm_config, deploy = _stage_vllm_config(case, model, tmp_path)
    connector = vllm_config.model_config.stage_connector_config
    assert connector["extra"]["stage_id"] == case.stage_id  # what OmniEngineArgs.create_model_config puts there
    stage = _build_through_overrides(vllm_config)
    assert isinstance(stage, Token2WavStageModel) and stage.family.name == case.family
    yaml_stage = next(s for s in deploy["stages"] if s["stage_id"] == case.stage_id)
    opts = stage.options
    assert opts.max_rows == yaml_stage.get("max_num_seqs", opts.max_rows) == vllm_config.scheduler_config.max_num_seqs
    assert opts.async_chunk is bool(deploy.get("async_chunk", False))
    assert str(opts.device) == "cpu" and opts.model == model
    audio = _one_step(stage, opts.async_chunk)
    assert audio.dtype == torch.float32 and audio.numel() > 0
    assert math.isfinite(float(audio.abs().max())) and float(audio.abs().max()) > 0
