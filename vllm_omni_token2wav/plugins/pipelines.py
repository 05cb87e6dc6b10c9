# SPDX-License-Identifier: Apache-2.0
"""Pipelines we add to vLLM-Omni: each family's code2wav stage alone, and behind a stand-in producer.

**Code2wav alone** (`<family>_code2wav`, deploy YAMLs in `vllm_omni_token2wav/deploy/`): one
`LLM_GENERATION` stage with no input source that owns its (skipped) tokenizer, so a request is
`{"prompt_token_ids": <codec ids>, "additional_information": {<voice keys>}}` (the request format is
in docs/design/token2wav_stage.md, "Requests without a producer"). For tests, and for users who
already have codec tokens.

**Behind a stand-in producer** (`standin_<family>_stream`): stage 0 is `Token2WavStandinProducer`
(a tiny AR model whose logits are forced to a deterministic codec sequence, `standin/producer.py`),
stage 1 the family's code2wav stage, joined by upstream's own async-chunk function for that family
(the one its real pipeline uses) over the shared-memory connector, as upstream's deploy YAMLs
configure it. The producer's config, tokenizer and weights are the model folder's
`standin_producer/` (`model_subdir`, `standin/model_dirs.py`). The Step-Audio2 producer's stage is
named `step_audio2_thinker`, so vLLM-Omni's speech endpoint serves it with its Step-Audio2 adapter.

The code2wav stages use upstream's architecture names, so `VLLM_OMNI_TOKEN2WAV_OVERRIDES` decides
whether they run our classes or upstream's.

Which families get which pipeline is derived from the family list (`token2wav_stage/families.py`): each
family's `family.py` `PipelineFacts` (architecture, stage names, upstream's async-chunk function, whether the
stand-in producer can feed it). `FAMILY_PIPELINES` / `STANDIN_STREAM_FAMILIES` are recomputed on access.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_omni_token2wav.model_executor.models.standin.model_dirs import PRODUCER_SUBDIR
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import registered_families

__all__ = [
    "PipelineFamily",
    "code2wav_pipeline",
    "family_pipelines",
    "register_pipelines",
    "standin_stream_families",
    "standin_stream_pipeline",
]


@dataclass(frozen=True)
class PipelineFamily:
    """How upstream's pipeline of a family names and feeds its code2wav stage."""

    family: str
    code2wav_arch: str
    code2wav_stage: str
    async_chunk_func: str
    producer_stage: str


def family_pipelines() -> dict[str, PipelineFamily]:
    """Family name -> its `PipelineFamily`, from each family's `PipelineFacts`."""
    return {
        f.name: PipelineFamily(
            f.name,
            f.pipelines.code2wav_arch,
            f.pipelines.code2wav_stage,
            f.pipelines.async_chunk_func,
            f.pipelines.producer_stage,
        )
        for f in registered_families()
    }


def standin_stream_families() -> tuple[str, ...]:
    """Families whose stand-in producer can feed the code2wav stage: their upstream async-chunk functions read
    the codes from the producer's token ids. MiniCPM-o's reads them from its talker's per-step multimodal
    output (`codes.audio`), which the stand-in producer does not emit."""
    return tuple(f.name for f in registered_families() if f.pipelines.standin_stream)


_DERIVED = {"FAMILY_PIPELINES": family_pipelines, "STANDIN_STREAM_FAMILIES": standin_stream_families}


def __getattr__(name: str) -> object:
    """`FAMILY_PIPELINES`, `STANDIN_STREAM_FAMILIES`: the functions above under their table names (PEP 562)."""
    derive = _DERIVED.get(name)
    if derive is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return derive()


def _code2wav_stage(spec: PipelineFamily, stage_id: int, input_sources: tuple[int, ...]):  # noqa: ANN202
    from vllm_omni.config.stage_config import StageExecutionType, StagePipelineConfig

    return StagePipelineConfig(
        stage_id=stage_id,
        model_stage=spec.code2wav_stage,
        execution_type=StageExecutionType.LLM_GENERATION,
        input_sources=input_sources,
        final_output=True,
        final_output_type="audio",
        engine_output_type="audio",
        owns_tokenizer=not input_sources,
        model_arch=spec.code2wav_arch,
        sampling_constraints={"detokenize": False},
    )


def code2wav_pipeline(family: str):  # noqa: ANN201
    """`<family>_code2wav`: the family's code2wav stage alone (see the module docstring)."""
    from vllm_omni.config.stage_config import PipelineConfig

    spec = family_pipelines()[family]
    return PipelineConfig(
        model_type=f"{family}_code2wav",
        model_arch=spec.code2wav_arch,
        stages=(_code2wav_stage(spec, 0, ()),),
    )


def standin_stream_pipeline(family: str):  # noqa: ANN201
    """`standin_<family>_stream`: stand-in producer -> upstream's async-chunk transfer -> code2wav."""
    from vllm_omni.config.stage_config import PipelineConfig, StageExecutionType, StagePipelineConfig

    spec = family_pipelines()[family]
    producer = StagePipelineConfig(
        stage_id=0,
        model_stage=spec.producer_stage,
        execution_type=StageExecutionType.LLM_AR,
        input_sources=(),
        owns_tokenizer=True,
        engine_output_type="latent",
        model_arch="Token2WavStandinProducer",
        model_subdir=PRODUCER_SUBDIR,
        tokenizer_subdir=PRODUCER_SUBDIR,
        async_chunk_process_next_stage_input_func=spec.async_chunk_func,
        sampling_constraints={"detokenize": False},
    )
    return PipelineConfig(
        model_type=f"standin_{family}_stream",
        model_arch="Token2WavStandinProducer",
        stages=(producer, _code2wav_stage(spec, 1, (0,))),
    )


def register_pipelines() -> list[str]:
    """Register every pipeline of the module docstring with vLLM-Omni; returns their names."""
    from vllm_omni.config.pipeline_registry import OMNI_PIPELINES, register_pipeline

    names = []
    pipelines = [code2wav_pipeline(family) for family in family_pipelines()]
    pipelines += [standin_stream_pipeline(family) for family in standin_stream_families()]
    for pipeline in pipelines:
        if pipeline.model_type not in OMNI_PIPELINES:  # idempotent, and no "clobbered" warning
            register_pipeline(pipeline)
        names.append(pipeline.model_type)
    return names
