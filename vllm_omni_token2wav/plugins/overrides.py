# SPDX-License-Identifier: Apache-2.0
"""Our stage classes under vLLM-Omni's architecture names: upstream's pipelines then build ours.

vLLM-Omni resolves a stage's class by architecture name in two registries: `OmniModelRegistry`
(what its stage model configs use to build the model) and vLLM's `ModelRegistry` (what vLLM's
`ModelConfig` validation inspects, in a subprocess, before the stage exists). Registering in the
first alone is not enough: vLLM-Omni re-registers its whole table into vLLM's registry every time
it creates a stage's model config (`vllm_omni.engine.arg_utils.register_omni_models_to_vllm`), so
vLLM would inspect upstream's class (and fail where upstream's module cannot import, e.g. Step-Audio2's
without `hyperpyyaml`). We therefore wrap that function (a patch: `patch/platform/patch_omni_model_registration.py`,
with its row in the patch register): each re-registration is followed by ours.

The table is derived from the family list (`token2wav_stage/families.py:FAMILY_MODULES`): each family's
`family.py` names its stage class and the upstream architectures it replaces (`StageServing`):

| upstream architecture name                     | served by (this fork), from the family's `family.py`   |
|------------------------------------------------|--------------------------------------------------------|
| `MiniCPMO45Code2Wav`                           | `minicpmo_4_5.minicpmo_4_5_code2wav.MiniCPMO45Code2Wav` |
| `StepAudio2Token2WavForConditionalGeneration`  | `step_audio2.step_audio2_token2wav_stage.               |
| `StepAudio2Token2WavModel` (Step-Audio2's      | StepAudio2Token2WavForConditionalGeneration`           |
| pipeline uses this alias)                      |                                                        |
| `CosyVoice3Model` (ONE class for the talker    | `cosyvoice3.cosyvoice3_model.CosyVoice3Model`: builds  |
| and code2wav stages, by `model_stage`)         | upstream's talker or our `CosyVoice3Code2Wav`           |

Added, not replacing anything: `Token2WavStandinProducer` (a deterministic codec-token producer
for the engine tests and `bench token2wav-serve --engine`, `standin/producer.py`), and the names a family
adds (`StageServing.added_architectures`, e.g. an out-of-tree family's own architecture).

`VLLM_OMNI_TOKEN2WAV_OVERRIDES` (read when the plugin loads, in every process) chooses per family:

| value                                  | upstream architectures served by ours                      |
|----------------------------------------|------------------------------------------------------------|
| unset, `1`, `true`, `on`, `yes`, `all` | every row of the table above                               |
| `0`, `false`, `off`, `no`, `none`      | none: vLLM-Omni's own classes everywhere                   |
| a comma list of families, e.g.         | those families' rows only (`FAMILY_ARCHITECTURES`); the    |
| `step_audio2,minicpmo_4_5`             | others keep upstream's classes (e.g. CosyVoice3 on CUDA,   |
|                                        | where upstream's TensorRT fp16 flow estimator is on by     |
|                                        | default)                                                   |

An unknown family name is an error naming the known ones (a typo must not silently serve upstream's
class). Which classes were replaced is logged once per process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import registered_families

logger = init_logger(__name__)

OVERRIDES_ENV = "VLLM_OMNI_TOKEN2WAV_OVERRIDES"
_PKG = "vllm_omni_token2wav.model_executor.models"
#: Architectures we add that belong to no family.
_PRODUCER_ARCHITECTURES: Mapping[str, str] = {
    "Token2WavStandinProducer": f"{_PKG}.standin.producer:Token2WavStandinProducer",
}


def stage_overrides() -> dict[str, str]:
    """Upstream architecture name -> our class ("module:Class"), the table of the module docstring."""
    return {arch: f.serving.stage_class for f in registered_families() for arch in f.serving.upstream_architectures}


def added_architectures() -> dict[str, str]:
    """Architectures we add (names upstream does not use): the stand-in producer and the families' own."""
    table = dict(_PRODUCER_ARCHITECTURES)
    table |= {arch: f.serving.stage_class for f in registered_families() for arch in f.serving.added_architectures}
    return table


def family_architectures() -> dict[str, tuple[str, ...]]:
    """Family name (the stage's `FamilySpec.name`) -> the upstream architectures its rows override."""
    return {f.name: f.serving.upstream_architectures for f in registered_families()}


#: The derived tables under their historical names (`STAGE_OVERRIDES`, `ADDED_ARCHITECTURES`,
#: `FAMILY_ARCHITECTURES`), recomputed from the family list on every access (PEP 562 `__getattr__`).
_DERIVED = {
    "STAGE_OVERRIDES": stage_overrides,
    "ADDED_ARCHITECTURES": added_architectures,
    "FAMILY_ARCHITECTURES": family_architectures,
}


def __getattr__(name: str) -> object:
    derive = _DERIVED.get(name)
    if derive is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return derive()


_TRUE = ("1", "true", "on", "yes", "all")
_FALSE = ("0", "false", "off", "no", "none")


def overridden_families() -> tuple[str, ...]:
    """The families whose stage classes are ours, from `VLLM_OMNI_TOKEN2WAV_OVERRIDES` (module docstring).

    ValueError naming the variable, the bad entry and the accepted values for anything else.
    """
    text = os.environ.get(OVERRIDES_ENV, "1").strip().lower() or "1"
    known = tuple(family_architectures())
    if text in _TRUE:
        return known
    if text in _FALSE:
        return ()
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(
            f"{OVERRIDES_ENV}={text!r}: unknown family {', '.join(unknown) or '(empty list)'}; expected one of "
            f"{', '.join(_TRUE + _FALSE)} or a comma list of {', '.join(known)}"
        )
    return tuple(family for family in known if family in names)


def overrides_enabled() -> bool:
    """True when at least one family is served by our classes (`overridden_families()`)."""
    return bool(overridden_families())


def active_table() -> dict[str, str]:
    """What `apply_overrides` registers in this process: the added architectures, and ours where chosen."""
    table = added_architectures()
    overrides, architectures = stage_overrides(), family_architectures()
    for family in overridden_families():
        table.update({arch: overrides[arch] for arch in architectures[family]})
    return table


def apply_overrides() -> dict[str, str]:
    """Register `active_table()` in both registries and keep it there (see the module docstring)."""
    table = active_table()
    _register(table)
    _reapply_after_upstream_registration()
    overrides = stage_overrides()
    replaced = sorted(arch for arch in table if arch in overrides)
    kept = sorted(arch for arch in overrides if arch not in table)
    if replaced:
        logger.info_once(
            "vllm-omni-token2wav serves %s with this fork's classes%s (%s=0 restores vLLM-Omni's)",
            ", ".join(replaced),
            f"; vLLM-Omni's own for {', '.join(kept)}" if kept else "",
            OVERRIDES_ENV,
        )
    else:
        logger.info_once("vllm-omni-token2wav: %s=0, vLLM-Omni's own stage classes are used", OVERRIDES_ENV)
    return table


def _register(table: Mapping[str, str]) -> None:
    from vllm.model_executor.models import ModelRegistry
    from vllm_omni.model_executor.models.registry import OmniModelRegistry

    for arch, target in table.items():
        OmniModelRegistry.register_model(arch, target)
        ModelRegistry.register_model(arch, target)


def _reapply_after_upstream_registration() -> None:
    """Follow every later `register_omni_models_to_vllm` call with ours (the patch and its register row:
    `patch/platform/patch_omni_model_registration.py`)."""
    from vllm_omni_token2wav.patch.platform import patch_omni_model_registration

    patch_omni_model_registration.install(lambda: _register(active_table()))


__all__ = [
    "OVERRIDES_ENV",
    "active_table",
    "added_architectures",
    "apply_overrides",
    "family_architectures",
    "overridden_families",
    "overrides_enabled",
    "stage_overrides",
]
