# SPDX-License-Identifier: Apache-2.0
"""The toy upstream-pipeline folders and deployments, checked without an engine.

- Each folder's `config.json` parses with vLLM's config loader into upstream's config classes (the
  folder's config module + `trust_remote_code`, as the engine loads it), with the ids upstream's code
  hard-codes (Step-Audio2's audio ids, MiniCPM-o's talker EOS and `num_vq`).
- The tokenizer carries the special tokens at the ids upstream's processors use and covers the vocabulary.
- The folder holds the token2wav assets where each family's code2wav stage looks for them.
- Each deployment, resolved by upstream's own `resolve_deploy_yaml`, differs from upstream's YAML only in
  the keys the package docstring lists (and a caller's overrides).
- The per-request sampling params are upstream's YAML defaults with only the length knobs changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

require_engine("the toy upstream-pipeline folder tests")

from vllm_omni_token2wav.model_executor.models.standin.toy import (  # noqa: E402
    CPU_KV_CACHE_BYTES,
    TOY_PIPELINES,
    step_audio2,  # noqa: E402
    upstream_deploy_yaml,
)
from vllm_omni_token2wav.model_executor.models.standin.toy import minicpmo_4_5 as minicpmo  # noqa: E402

FAMILIES = ("step_audio2", "minicpmo_4_5")


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, TOY_PIPELINES[request.param].ensure_model_dir()


def test_the_registry_offers_both_families() -> None:
    assert set(FAMILIES) <= set(TOY_PIPELINES)
    assert TOY_PIPELINES["step_audio2"] is step_audio2.PIPELINE
    assert TOY_PIPELINES["minicpmo_4_5"] is minicpmo.PIPELINE
    with pytest.raises(KeyError, match="no toy upstream pipeline for 'nope'"):
        TOY_PIPELINES["nope"]


def test_the_folder_holds_the_token2wav_assets_where_the_code2wav_stage_looks(folder: tuple[str, Path]) -> None:
    family, path = folder
    assets = path / ("token2wav" if family == "step_audio2" else "assets/token2wav")
    for name in ("campplus.onnx", "speech_tokenizer_v2_25hz.onnx", "flow.yaml", "flow.pt", "hift.pt"):
        assert (assets / name).is_file(), name
    if family == "minicpmo_4_5":
        assert (path / "assets" / "HT_ref_audio.wav").is_file()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name


def test_the_step_audio2_config_parses_into_a_qwen2_text_config_with_the_real_vocabulary() -> None:
    from transformers import Qwen2Config
    from vllm.transformers_utils.config import get_config

    config = get_config(str(step_audio2.ensure_step_audio2_dir()), trust_remote_code=True)
    assert config.model_type == "step_audio_2"
    assert isinstance(config.text_config, Qwen2Config)  # the thinker checks isinstance(PretrainedConfig)
    assert config.get_text_config().vocab_size == 158720
    assert config.text_config.hidden_size == config.audio_encoder_config["llm_dim"] == 128
    # the audio ids upstream hard-codes fit the vocabulary
    from vllm_omni.model_executor.models.step_audio2.step_audio2_constants import DEFAULT_TOKEN_CONFIG

    assert DEFAULT_TOKEN_CONFIG.audio_start == step_audio2.AUDIO_START
    assert DEFAULT_TOKEN_CONFIG.audio_end < config.get_text_config().vocab_size


def test_the_minicpmo_config_parses_into_vllm_omnis_minicpmo_config_with_typed_sub_configs() -> None:
    from transformers import WhisperConfig
    from vllm.transformers_utils.config import get_config
    from vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_omni_llm import MiniCPMOConfig, SiglipVisionConfig

    config = get_config(str(minicpmo.ensure_minicpmo_4_5_dir()), trust_remote_code=True)
    assert isinstance(config, MiniCPMOConfig) and str(config.version) == "4.5"
    assert isinstance(config.vision_config, SiglipVisionConfig) and config.vision_config.hidden_size == 64
    assert isinstance(config.audio_config, WhisperConfig) and config.audio_config.encoder_ffn_dim // 4 == 64
    tts = config.tts_config
    assert tts.model_type == "minicpmtts" and tts.num_vq == 1 and tts.llm_dim == config.hidden_size
    assert tts.num_audio_tokens - 1 == minicpmo.CODEC_EOS == 6561  # the pipeline's stage-1 stop id
    assert tts.num_text_tokens >= config.vocab_size
    assert config.to_dict()["attention_bias"] is False  # upstream picks its Qwen3 thinker on this


@pytest.mark.parametrize(
    ("family", "ids"),
    [
        ("step_audio2", {"<|im_start|>": 151644, "<|im_end|>": 151645, "<audio_patch>": 151690}),
        ("minicpmo_4_5", {"<|im_end|>": 151645, "<|tts_bos|>": 151703, "<|tts_eos|>": 151704}),
    ],
)
def test_the_tokenizer_has_the_ids_upstreams_processors_use(family: str, ids: dict[str, int]) -> None:
    from transformers import AutoTokenizer

    path = TOY_PIPELINES[family].ensure_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    config = json.loads((path / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    assert len(tokenizer) == vocab
    for name, token_id in ids.items():
        assert tokenizer.convert_tokens_to_ids(name) == token_id
    assert tokenizer.decode([vocab - 1])  # the last id a random model may sample decodes


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= _flatten(item, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): value}


def _stages(resolved: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(s["stage_id"]): _flatten(s) for s in resolved["stages"]}


#: What each overlay may change, per stage (the package docstring's table).
CHANGED = {
    ("step_audio2", True): {
        0: {"devices": "0", "tensor_parallel_size": 1, "enforce_eager": True, "load_format": "dummy"},
        1: {"devices": "0", "tensor_parallel_size": 1, "additional_config.token2wav_n_timesteps": 2},
    },
    ("step_audio2", False): {
        0: {"devices": "0", "tensor_parallel_size": 1, "enforce_eager": True, "load_format": "dummy"},
        1: {"devices": "0", "tensor_parallel_size": 1, "additional_config.token2wav_n_timesteps": 2},
    },
    ("minicpmo_4_5", True): {
        sid: {
            "devices": "0",
            "tensor_parallel_size": 1,
            "enforce_eager": True,
            "load_format": "dummy",
            "limit_mm_per_prompt.image": 0,
            "limit_mm_per_prompt.audio": 0,
            "limit_mm_per_prompt.video": 0,
        }
        for sid in (0, 1)
    }
    | {2: {"devices": "0", "tensor_parallel_size": 1, "additional_config.token2wav_n_timesteps": 2}},
}


@pytest.mark.parametrize(("family", "async_chunk"), sorted(CHANGED))
def test_the_deployment_changes_only_the_listed_keys_of_upstreams_yaml(
    tmp_path: Path, family: str, async_chunk: bool
) -> None:
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    pipeline = TOY_PIPELINES[family]
    overlay = pipeline.deployment(Path("unused"), tmp_path, async_chunk=async_chunk)
    assert f'base_config: "{upstream_deploy_yaml(pipeline.yaml_name(async_chunk=async_chunk))}"' in (
        overlay.read_text()
    )
    base = resolve_deploy_yaml(upstream_deploy_yaml(pipeline.yaml_name(async_chunk=async_chunk)))
    ours = resolve_deploy_yaml(overlay)
    assert {k: v for k, v in ours.items() if k not in ("stages", "platforms")} == {
        k: v for k, v in base.items() if k not in ("stages", "platforms")
    }
    before, after = _stages(base), _stages(ours)
    assert sorted(after) == sorted(before)
    for sid, keys in after.items():
        changed = {k: v for k, v in keys.items() if before[sid].get(k, object()) != v}
        assert changed == {k: v for k, v in CHANGED[family, async_chunk][sid].items() if before[sid].get(k) != v}, sid
        assert set(before[sid]) <= set(keys), sid  # nothing of upstream's dropped
    cpu = {int(s["stage_id"]): s for s in ours["platforms"]["cpu"]["stages"]}
    assert cpu == {sid: {"stage_id": sid, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES} for sid in after}
    for name, platform in base.get("platforms", {}).items():
        assert ours["platforms"][name] == platform  # upstream's cuda / npu sections untouched


def test_stage_overrides_go_over_the_forced_keys(tmp_path: Path) -> None:
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    overlay = step_audio2.PIPELINE.deployment(
        Path("unused"),
        tmp_path,
        async_chunk=True,
        stage_overrides={0: {"default_sampling_params": {"max_tokens": 40}}, 1: {"max_num_seqs": 3}},
    )
    stages = {s["stage_id"]: s for s in resolve_deploy_yaml(overlay)["stages"]}
    assert stages[0]["default_sampling_params"]["max_tokens"] == 40
    assert stages[0]["default_sampling_params"]["temperature"] == 0.7  # upstream's, deep-merged
    assert stages[1]["max_num_seqs"] == 3 and stages[1]["additional_config"] == {"token2wav_n_timesteps": 2}


def test_step_audio2_requests_are_upstreams_defaults_with_only_the_reply_length_pinned() -> None:
    prompt, params = step_audio2.PIPELINE.offline_prompt("Hello.", codes=33, seed=5)
    assert prompt["prompt"].endswith("Hello.<|im_end|>\n<|im_start|>assistant\n<tts_start>")
    thinker, code2wav = params
    assert (thinker.max_tokens, thinker.temperature, thinker.top_p, thinker.seed) == (33, 0.7, 0.9, 5)
    assert thinker.repetition_penalty == 1.05
    allowed = thinker.allowed_token_ids
    assert min(allowed) == 151696 and max(allowed) == 151696 + 6560 and len(allowed) == 6561
    assert code2wav.max_tokens == 1 and code2wav.temperature == 0.0


def test_minicpmo_requests_are_upstreams_defaults_with_only_the_lengths_pinned() -> None:
    prompt, params = minicpmo.PIPELINE.offline_prompt("Hi.", codes=30, text_tokens=7, seed=2, voice=([0.1] * 8, 16000))
    assert prompt["prompt"] == "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\n"
    wav, rate = prompt[minicpmo.REFERENCE_AUDIO_KEY]
    assert rate == 16000 and wav.shape == (8,)
    thinker, talker, code2wav = params
    assert (thinker.max_tokens, thinker.min_tokens, thinker.temperature) == (7, 7, 0.0)
    assert (talker.max_tokens, talker.min_tokens, talker.top_k, talker.top_p) == (30, 30, 25, 0.85)
    assert talker.temperature == 0.8 and talker.repetition_penalty == 1.05
    assert code2wav.max_tokens == 65536
