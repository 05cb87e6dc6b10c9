# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni 0.30's code2wav options, one check per row of docs/design/upstream_options.md.

Configs are duck-typed `VllmConfig`s (the connector's `extra` in `model_config.stage_connector_config`,
`additional_config` beside it) as the other option tests build them; no engine, no model.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import stage_options
from vllm_omni_token2wav.model_executor.models.token2wav_stage.upstream_options import read_upstream_options

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

FAMILIES = ("minicpmo_4_5", "step_audio2", "cosyvoice3")


def _config(extra: dict[str, Any] | None = None, additional: dict[str, Any] | None = None) -> Any:
    connector = {"name": "SharedMemoryConnector", "extra": {**(extra or {}), "stage_id": 1}}
    model_config = SimpleNamespace(model="/m", stage_connector_config=connector, hf_config=None, async_chunk=True)
    return SimpleNamespace(model_config=model_config, additional_config=additional or {})


def _warnings(extra: dict[str, Any], family: str, environ: dict[str, str] | None = None) -> list[str]:
    return read_upstream_options(extra, family, environ or {}).warnings


# ---- codec keys: what each family's producer reads ----------------------------------------------


def test_left_context_other_than_3_is_refused_for_minicpmo_whose_producer_repeats_it() -> None:
    with pytest.raises(ValueError, match="codec_left_context_frames=25: the flow's pre-lookahead is 3"):
        stage_options(_config({"codec_left_context_frames": 25}), {}, family="minicpmo_4_5")
    with pytest.raises(ValueError, match="codec_left_context_frames=2"):
        stage_options(_config({"codec_left_context_frames": 2}), {})  # no family: the strictest rule


@pytest.mark.parametrize("family", ["cosyvoice3", "step_audio2"])
def test_left_context_is_warned_about_not_refused_where_the_producer_does_not_read_it(family: str) -> None:
    opts = stage_options(_config({"codec_left_context_frames": 25}), {}, family=family)
    assert opts.max_rows == 32  # built
    (text,) = _warnings({"codec_left_context_frames": 25}, family)
    assert "codec_left_context_frames=25" in text and f"the {family} producer does not read it" in text
    assert "3-token lookahead" in text
    assert _warnings({"codec_left_context_frames": 3}, family) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_negative_left_context_and_non_positive_chunk_are_rejected_as_upstream_does(family: str) -> None:
    with pytest.raises(ValueError, match="codec_left_context_frames=-1: must be >= 0"):
        stage_options(_config({"codec_left_context_frames": -1}), {}, family=family)
    with pytest.raises(ValueError, match="codec_chunk_frames=0: must be > 0"):
        stage_options(_config({"codec_chunk_frames": 0}), {}, family=family)
    with pytest.raises(ValueError, match="codec_chunk_frames='x': vLLM-Omni reads it as an int"):
        stage_options(_config({"codec_chunk_frames": "x"}), {}, family=family)


def test_chunk_frames_is_honoured_as_sent_and_warned_about_only_for_step_audio2() -> None:
    for family in ("minicpmo_4_5", "cosyvoice3"):
        assert _warnings({"codec_chunk_frames": 15}, family) == []
    (text,) = _warnings({"codec_chunk_frames": 15}, "step_audio2")
    assert "codec_chunk_frames=15" in text and "25 + 3 tokens" in text
    assert _warnings({"codec_chunk_frames": 25}, "step_audio2") == []


def test_cosyvoice3_lookahead_must_be_3_and_its_hop_keys_are_validated_as_its_producer_does() -> None:
    with pytest.raises(ValueError, match="codec_pre_lookahead_frames=5: the CosyVoice3 flow looks 3 tokens ahead"):
        stage_options(_config({"codec_pre_lookahead_frames": 5}), {}, family="cosyvoice3")
    for key, bad in (
        ("codec_max_chunk_frames", 0),
        ("codec_stream_scale_factor", 0),
        ("codec_pre_lookahead_frames", -1),
    ):
        with pytest.raises(ValueError, match="CosyVoice3 producer rejects these values too"):
            stage_options(_config({key: bad}), {}, family="cosyvoice3")
    extra = {"codec_max_chunk_frames": 100, "codec_stream_scale_factor": 2, "codec_vocab_size": 6561}
    assert _warnings(extra, "cosyvoice3") == []
    texts = _warnings(extra, "minicpmo_4_5")
    assert len(texts) == 2 and all("only vLLM-Omni's CosyVoice3 producer reads it" in t for t in texts)


# ---- MiniCPM-o class keys -----------------------------------------------------------------------


def test_runtime_prompt_cache_capacity_maps_to_the_prompt_cache_size_and_negative_is_rejected() -> None:
    assert stage_options(_config({"token2wav_runtime_prompt_cache_size": 7}), {}).prompt_cache_size == 7
    assert stage_options(_config({"token2wav_runtime_prompt_cache_size": 0}), {}).prompt_cache_size == 0
    assert stage_options(_config(), {}).prompt_cache_size is None  # the core's default
    with pytest.raises(ValueError, match="token2wav_runtime_prompt_cache_size=-1: the prompt cache capacity"):
        stage_options(_config({"token2wav_runtime_prompt_cache_size": -1}), {})


def test_setup_cache_size_rejects_negative_as_upstream_does() -> None:
    assert stage_options(_config({"token2wav_setup_cache_size": 0}), {}).setup_cache_size == 0
    with pytest.raises(ValueError, match="token2wav_setup_cache_size must be >= 0"):
        stage_options(_config({"token2wav_setup_cache_size": -1}), {})


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"code2wav_min_batch_size": 0}, "code2wav_min_batch_size=0: must be >= 1"),
        ({"code2wav_initial_batch_size": -1}, "code2wav_initial_batch_size=-1: must be >= 0"),
        ({"code2wav_min_batch_size": 1, "code2wav_initial_batch_size": 0}, None),
        ({"code2wav_min_batch_size": 4, "code2wav_initial_batch_size": 2}, "must be 0 or >= the minimum"),
        ({"code2wav_min_batch_size": 2}, "code2wav_min_batch_size=2: vLLM-Omni's class fails a step"),
        ({"code2wav_initial_batch_size": 2}, "code2wav_initial_batch_size=2: this stage does not split"),
    ],
)
def test_batching_keys_upstream_rules_then_ours(extra: dict[str, Any], match: str | None) -> None:
    if match is None:
        assert stage_options(_config(extra), {}).max_rows == 32
        return
    with pytest.raises(ValueError, match=match):
        stage_options(_config(extra), {})


@pytest.mark.parametrize(
    ("extra", "additional", "graphs"),
    [
        ({"enable_cfm_graph": True, "enable_hift_graph": True}, {}, None),  # the shipped YAMLs: graphs, auto
        ({"enable_cfm_graph": False, "enable_hift_graph": False}, {}, False),
        ({"enable_cfm_graph": False, "enable_hift_graph": True}, {}, None),
        ({}, {"code2wav_enable_npu_graph": True, "code2wav_max_npu_graphs": 32}, None),  # platforms.npu overlay
        ({}, {"code2wav_enable_npu_graph": True, "code2wav_max_npu_graphs": 0}, False),
        ({}, {"code2wav_enable_npu_graph": "false"}, False),
        ({"enable_cfm_graph": False, "token2wav_device_graphs": True}, {}, True),  # ours wins
        ({}, {}, None),
    ],
)
def test_graph_switches_map_to_device_graphs(extra: dict[str, Any], additional: dict[str, Any], graphs: Any) -> None:
    assert stage_options(_config(extra, additional), {}, family="minicpmo_4_5").device_graphs is graphs


def test_graph_tuning_keys_warn_only_away_from_upstreams_defaults() -> None:
    shipped = {"cfm_max_graphs": 32, "hift_graph_capture_batch_sizes": [1], "code2wav_max_npu_graphs": 32}
    assert _warnings(shipped, "minicpmo_4_5") == []
    (text,) = _warnings({"cfm_graph_bucket_frames": 16}, "minicpmo_4_5")  # what minicpmo_4_5*.yaml sets
    assert "cfm_graph_bucket_frames=16 has no effect" in text and "own frame buckets" in text
    assert len(_warnings({"cfm_max_graphs": 8, "hift_graph_capture_batch_sizes": [1, 2]}, "minicpmo_4_5")) == 2
    with pytest.raises(ValueError, match="cfm_max_graphs='many'"):
        read_upstream_options({"cfm_max_graphs": "many"}, "minicpmo_4_5", {})


def test_bfloat16_attention_cache_maps_to_the_kv_cache_dtype_and_conflicts_are_refused() -> None:
    opts = stage_options(_config({"code2wav_bfloat16_attention_cache": True}), {})
    assert opts.kv_cache_dtype is torch.bfloat16
    assert stage_options(_config({"code2wav_bfloat16_attention_cache": False}), {}).kv_cache_dtype is None
    both = {"code2wav_bfloat16_attention_cache": True, "token2wav_kv_cache_dtype": "float32"}
    with pytest.raises(ValueError, match="token2wav_kv_cache_dtype='float32'; keep one of the two"):
        stage_options(_config(both), {})


def test_tensorrt_is_refused_with_what_to_use_and_its_tuning_keys_warn() -> None:
    with pytest.raises(ValueError, match="token2wav_trt=true: this stage has no TensorRT DiT.*token2wav_device_graphs"):
        stage_options(_config({"token2wav_trt": True}), {})
    assert stage_options(_config({"token2wav_trt": False}), {}).max_rows == 32
    texts = _warnings({"token2wav_trt_dtype": "fp16", "token2wav_trt_max_batch": 8}, "minicpmo_4_5")
    assert len(texts) == 2 and all("no TensorRT estimator" in t for t in texts)


def test_prompt_cache_id_warns_only_when_renamed() -> None:
    assert _warnings({"prompt_cache_id": "HT_ref_audio"}, "minicpmo_4_5") == []
    (text,) = _warnings({"prompt_cache_id": "mine"}, "minicpmo_4_5")
    assert "cached by content" in text


@pytest.mark.parametrize(("key", "value"), [("ref_audio_max_seconds", 0), ("ref_audio_max_seconds", -1.0)])
def test_reference_seconds_rejects_what_upstream_rejects(key: str, value: float) -> None:
    with pytest.raises(ValueError, match="ref_audio_max_seconds must be in"):
        stage_options(_config({key: value}), {})


# ---- environment ------------------------------------------------------------------------------


def test_environment_toggles_of_upstreams_tensorrt_paths_warn_for_their_family() -> None:
    (text,) = _warnings({}, "minicpmo_4_5", {"MINICPMO_TOKEN2WAV_TRT": "1"})
    assert "MINICPMO_TOKEN2WAV_TRT='1'" in text
    assert _warnings({}, "step_audio2", {"MINICPMO_TOKEN2WAV_TRT": "1"}) == []
    assert _warnings({}, "cosyvoice3", {"COSYVOICE3_TRT": "0"}) == []
    (text,) = _warnings({}, "cosyvoice3", {"COSYVOICE3_TRT": "1"})
    assert "COSYVOICE3_TRT='1'" in text and "runs in torch" in text
    assert len(_warnings({}, "cosyvoice3", {"COSYVOICE3_ESTIMATOR_ONNX": "/x.onnx"})) == 1


def test_the_warnings_are_logged_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_omni_token2wav.model_executor.models.token2wav_stage import upstream_options

    seen: list[str] = []
    monkeypatch.setattr(upstream_options.logger, "warning_once", lambda fmt, *args: seen.append(fmt % args))
    stage_options(_config({"codec_left_context_frames": 25, "codec_chunk_frames": 15}), {}, family="cosyvoice3")
    assert len(seen) == 1 and "codec_left_context_frames=25" in seen[0]
