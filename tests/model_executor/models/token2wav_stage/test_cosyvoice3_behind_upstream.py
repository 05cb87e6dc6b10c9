# SPDX-License-Identifier: Apache-2.0
"""Our stages behind upstream's own CosyVoice3 pipeline: the audio key through vLLM-Omni's rename and speech endpoint,
and upstream's deploy YAML through our lookahead check (the last test).

vLLM-Omni's generation runner hands each request's dict of the stage's `multimodal_outputs` to
`MultimodalPayload.from_raw(payload, engine_output_type)`, which renames the producer key `model_outputs`
to the stage's `engine_output_type`; the speech endpoint (`OmniOpenAIServingSpeech._extract_audio_output`)
finds audio only under `audio` or `model_outputs`. Upstream's CosyVoice3 pipeline declares `latent` for its
code2wav stage (its own class returns `audio`), so a CosyVoice3 stage returning `model_outputs` was served
as "TTS model did not produce audio output" (HTTP 400). The expected keys below are upstream's functions'
answers on the per-request dicts our `build_output` yields, not our own rule.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.engine import require_engine
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import SegmentResult, build_output
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import ERROR_KEY
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import (
    COSYVOICE3,
    MINICPMO_4_5,
    STEP_AUDIO2,
    FamilySpec,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the output key against vLLM-Omni's own rename and speech endpoint")


def _served_key(spec: FamilySpec, engine_output_type: str) -> tuple[str | None, torch.Tensor | None]:
    """What upstream's client side makes of one request's output of our stage: (audio key found, audio)."""
    from vllm_omni.entrypoints.openai.serving_speech import OmniOpenAIServingSpeech
    from vllm_omni.outputs.mm_outputs import MultimodalPayload

    audio = torch.linspace(-0.5, 0.5, 7)
    out = build_output([SegmentResult(audio=audio)], torch.device("cpu"), spec.output_key).multimodal_outputs
    per_request = {key: values[0] for key, values in out.items()}  # the runner's split (gpu_generation_model_runner)
    payload = MultimodalPayload.from_raw(per_request, engine_output_type)
    mm, key = OmniOpenAIServingSpeech._extract_audio_output(SimpleNamespace(multimodal_output=payload))
    return key, None if key is None else mm[key]


def _upstream_code2wav_output_type() -> str:
    from vllm_omni.model_executor.models.cosyvoice3.pipeline import COSYVOICE3_PIPELINE

    (stage,) = [s for s in COSYVOICE3_PIPELINE.stages if s.model_stage == "cosyvoice3_code2wav"]
    return stage.engine_output_type


def test_cosyvoice3_audio_is_found_behind_upstreams_own_talker() -> None:
    assert _upstream_code2wav_output_type() == "latent"  # the fact that made `model_outputs` unservable
    key, audio = _served_key(COSYVOICE3, "latent")
    assert key == "audio" and audio is not None
    assert torch.equal(audio, torch.linspace(-0.5, 0.5, 7))
    # the key that failed: renamed to `latent`, which the endpoint does not look at
    assert _served_key(FamilySpec(**{**COSYVOICE3.__dict__, "output_key": "model_outputs"}), "latent")[0] is None


@pytest.mark.parametrize("spec", [MINICPMO_4_5, STEP_AUDIO2, COSYVOICE3], ids=lambda s: s.name)
def test_every_family_is_found_behind_our_pipelines(spec: FamilySpec) -> None:
    """Our pipelines (`plugins/pipelines.py`) declare `audio` for every code2wav stage: each key arrives as `audio`."""
    from vllm_omni_token2wav.plugins.pipelines import code2wav_pipeline

    assert code2wav_pipeline(spec.name).stages[0].engine_output_type == "audio"
    assert _served_key(spec, "audio")[0] == "audio"


def test_the_other_families_keep_the_runners_producer_key() -> None:
    for spec in (MINICPMO_4_5, STEP_AUDIO2):
        out = build_output([SegmentResult(audio=torch.ones(3))], torch.device("cpu"), spec.output_key)
        assert set(out.multimodal_outputs) == {"model_outputs", "sr", ERROR_KEY}
    out = build_output(
        [SegmentResult(audio=torch.ones(3)), SegmentResult()], torch.device("cpu"), COSYVOICE3.output_key
    )
    assert set(out.multimodal_outputs) == {"audio", "sr", ERROR_KEY}
    assert [a.numel() for a in out.multimodal_outputs["audio"]] == [3, 0]


def _connector_config(extra: dict[str, object]) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(stage_connector_config={"extra": extra}), additional_config=None
    )


def test_upstreams_own_yaml_passes_the_lookahead_check_for_cosyvoice3_only() -> None:
    """Upstream's `cosyvoice3.yaml` sets `codec_left_context_frames: 25`, which its talker ignores (it repeats
    `codec_pre_lookahead_frames`, default 3): our CosyVoice3 stage starts on it; MiniCPM-o, whose producer re-sends
    that many tokens, would not (the per-family rules: `upstream_options.py`)."""
    import vllm_omni
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import stage_options

    yaml = resolve_deploy_yaml(Path(vllm_omni.__file__).parent / "deploy" / "cosyvoice3.yaml")
    extra = dict(yaml["connectors"]["connector_of_shared_memory"]["extra"])
    assert extra["codec_left_context_frames"] == 25 and "codec_pre_lookahead_frames" not in extra
    assert stage_options(_connector_config(extra), {}, family=COSYVOICE3.name).n_timesteps == 10
    with pytest.raises(ValueError, match="codec_left_context_frames=25"):
        stage_options(_connector_config(extra), {}, family=MINICPMO_4_5.name)
    with pytest.raises(ValueError, match="codec_pre_lookahead_frames=5"):
        stage_options(_connector_config({**extra, "codec_pre_lookahead_frames": 5}), {}, family=COSYVOICE3.name)


def test_the_cosyvoice3_stage_itself_returns_its_audio_under_audio(cv3_dir: Path) -> None:
    """The stage's own `forward` (not only `build_output`) uses the family key: a pre-warm placeholder step
    (no model work) already answers under `audio`, which upstream's speech endpoint then finds behind `latent`."""
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav

    stage = CosyVoice3Code2Wav(model=str(cv3_dir), device="cpu", n_timesteps=2)
    runner_keys = {"global_request_id": ["r"], "omni_final_stage_id": 1, "generated_len": 0}
    out = stage(
        torch.zeros(1, dtype=torch.int32),
        None,
        runtime_additional_information=[runner_keys],
        seq_token_counts=[1],
        request_ids=["r"],
    ).multimodal_outputs
    assert set(out) == {"audio", "sr", ERROR_KEY} and [a.numel() for a in out["audio"]] == [0]
