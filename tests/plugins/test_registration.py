# SPDX-License-Identifier: Apache-2.0
"""The plugin as vLLM-Omni loads it: entry points, registration, the disable switch, the CPU platform.

Registration changes process-global registries (vLLM's `ModelRegistry`, vLLM-Omni's
`OmniModelRegistry` and pipeline table), so every check that registers runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the plugin registration tests")

UPSTREAM = "vllm_omni.model_executor.models"
OURS = "vllm_omni_token2wav.model_executor.models"


def _run(code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON line last, which is returned."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL": "INFO", **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"result": json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


_RESOLVE = """
import json
from vllm.model_executor.models import ModelRegistry
from vllm_omni.model_executor.models.registry import OmniModelRegistry
from vllm_omni.config.pipeline_registry import OMNI_PIPELINES

def where(registry, arch):
    model = registry.models[arch]
    return f"{model.module_name}:{model.class_name}"

def snapshot():
    archs = ["MiniCPMO45Code2Wav", "StepAudio2Token2WavModel", "StepAudio2Token2WavForConditionalGeneration",
             "CosyVoice3Model", "Token2WavStandinProducer"]
    return {
        "omni": {a: where(OmniModelRegistry, a) for a in archs if a in OmniModelRegistry.models},
        "vllm": {a: where(ModelRegistry, a) for a in archs if a in ModelRegistry.models},
        "pipelines": sorted(k for k in OMNI_PIPELINES if k.endswith("_code2wav") or k.startswith("standin_")),
    }
"""


def test_the_distribution_declares_the_three_entry_points() -> None:
    dist = importlib.metadata.distribution("vllm-omni-token2wav")
    points = {(e.group, e.value) for e in dist.entry_points}
    assert ("vllm_omni.general_plugins", "vllm_omni_token2wav.plugins:register") in points
    assert ("vllm.general_plugins", "vllm_omni_token2wav.plugins:register") in points
    assert ("vllm_omni.platform_plugins", "vllm_omni_token2wav.plugins:cpu_platform_plugin") in points
    assert "vllm-omni-token2wav" in {e.name for e in dist.entry_points if e.group == "console_scripts"}
    assert "vllm-omni" not in {e.name for e in dist.entry_points if e.group == "console_scripts"}


def test_loading_the_plugins_serves_upstreams_architectures_with_our_classes_in_both_registries() -> None:
    out = _run(
        _RESOLVE
        + """
from vllm_omni.plugins import load_omni_general_plugins
load_omni_general_plugins()
print(json.dumps(snapshot()))
"""
    )
    got = out["result"]
    for registry in ("omni", "vllm"):
        assert got[registry]["MiniCPMO45Code2Wav"] == f"{OURS}.minicpmo_4_5.minicpmo_4_5_code2wav:MiniCPMO45Code2Wav"
        for arch in ("StepAudio2Token2WavModel", "StepAudio2Token2WavForConditionalGeneration"):
            assert got[registry][arch].startswith(f"{OURS}.step_audio2.step_audio2_token2wav_stage:")
        assert got[registry]["CosyVoice3Model"] == f"{OURS}.cosyvoice3.cosyvoice3_model:CosyVoice3Model"
        assert got[registry]["Token2WavStandinProducer"].startswith(f"{OURS}.standin.producer:")
    assert set(got["pipelines"]) >= {
        "minicpmo_4_5_code2wav",
        "step_audio2_code2wav",
        "cosyvoice3_code2wav",
        "standin_step_audio2_stream",
        "standin_cosyvoice3_stream",
    }
    assert out["stderr"].count("vllm-omni-token2wav serves") == 1, out["stderr"][-2000:]


def test_registering_twice_and_upstreams_re_registration_keep_ours() -> None:
    out = _run(
        _RESOLVE
        + """
from vllm_omni_token2wav.plugins import register
import vllm_omni.engine.arg_utils as arg_utils
register(); register()
# vLLM-Omni re-registers its whole table into vLLM's registry whenever it creates a stage model config.
arg_utils.register_omni_models_to_vllm()
arg_utils.register_omni_models_to_vllm()
print(json.dumps(snapshot()))
"""
    )
    got = out["result"]
    assert got["vllm"]["MiniCPMO45Code2Wav"].startswith(OURS) and got["omni"]["MiniCPMO45Code2Wav"].startswith(OURS)
    assert out["stderr"].count("vllm-omni-token2wav serves") == 1


def test_the_disable_switch_gives_upstreams_classes_and_keeps_our_pipelines() -> None:
    out = _run(
        _RESOLVE
        + """
from vllm_omni.plugins import load_omni_general_plugins
import vllm_omni.engine.arg_utils as arg_utils
load_omni_general_plugins()
arg_utils.register_omni_models_to_vllm()
print(json.dumps(snapshot()))
""",
        VLLM_OMNI_TOKEN2WAV_OVERRIDES="0",
    )
    got = out["result"]
    for registry in ("omni", "vllm"):
        assert got[registry]["MiniCPMO45Code2Wav"].startswith(f"{UPSTREAM}.minicpmo_4_5.")
        assert got[registry]["StepAudio2Token2WavModel"].startswith(f"{UPSTREAM}.step_audio2.")
        assert got[registry]["CosyVoice3Model"].startswith(f"{UPSTREAM}.cosyvoice3.")
        assert got[registry]["Token2WavStandinProducer"].startswith(OURS)
    assert "step_audio2_code2wav" in got["pipelines"]
    assert "OVERRIDES=0, vLLM-Omni's own stage classes are used" in out["stderr"]


def test_a_family_list_serves_those_families_with_ours_and_the_others_with_upstreams() -> None:
    out = _run(
        _RESOLVE
        + """
from vllm_omni.plugins import load_omni_general_plugins
import vllm_omni.engine.arg_utils as arg_utils
load_omni_general_plugins()
arg_utils.register_omni_models_to_vllm()  # the engine's re-registration keeps the per-family choice
print(json.dumps(snapshot()))
""",
        VLLM_OMNI_TOKEN2WAV_OVERRIDES=" step_audio2, minicpmo_4_5 ",
    )
    got = out["result"]
    for registry in ("omni", "vllm"):
        assert got[registry]["MiniCPMO45Code2Wav"].startswith(f"{OURS}.minicpmo_4_5.")
        for arch in ("StepAudio2Token2WavModel", "StepAudio2Token2WavForConditionalGeneration"):
            assert got[registry][arch].startswith(f"{OURS}.step_audio2."), arch
        assert got[registry]["CosyVoice3Model"].startswith(f"{UPSTREAM}.cosyvoice3.")
    assert "vLLM-Omni's own for CosyVoice3Model" in out["stderr"]


@pytest.mark.parametrize(
    ("value", "families"),
    [
        ("", ("minicpmo_4_5", "step_audio2", "cosyvoice3")),
        ("all", ("minicpmo_4_5", "step_audio2", "cosyvoice3")),
        ("None", ()),
        ("cosyvoice3", ("cosyvoice3",)),
        ("cosyvoice3,step_audio2", ("step_audio2", "cosyvoice3")),
    ],
)
def test_the_switch_values_name_the_families_served_by_ours(
    value: str, families: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_omni_token2wav.plugins.overrides import STAGE_OVERRIDES, active_table, overridden_families

    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_OVERRIDES", value)
    assert overridden_families() == families
    ours = {arch for arch in active_table() if arch in STAGE_OVERRIDES}
    assert ("CosyVoice3Model" in ours) == ("cosyvoice3" in families)
    assert ("StepAudio2Token2WavModel" in ours) == ("step_audio2" in families)


@pytest.mark.parametrize("value", ["maybe", "step_audio2,cosyvoice", ","])
def test_a_bad_switch_value_is_a_clear_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_omni_token2wav.plugins.overrides import overrides_enabled

    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_OVERRIDES", value)
    with pytest.raises(ValueError, match=r"VLLM_OMNI_TOKEN2WAV_OVERRIDES=.*unknown family.*step_audio2"):
        overrides_enabled()


def test_the_cpu_platform_applies_only_where_no_accelerator_platform_does() -> None:
    out = _run(
        """
import json
import vllm_omni.platforms as platforms
from vllm_omni_token2wav.plugins import cpu_platform_plugin
alone = cpu_platform_plugin()
platforms.builtin_omni_platform_plugins["cuda"] = lambda: "vllm_omni.platforms.cuda.platform.CudaOmniPlatform"
with_cuda = cpu_platform_plugin()
platforms.builtin_omni_platform_plugins["cuda"] = lambda: 1 / 0  # a detector that fails does not claim the host
broken = cpu_platform_plugin()
print(json.dumps([alone, with_cuda, broken]))
"""
    )
    alone, with_cuda, broken = out["result"]
    assert alone == "vllm_omni_token2wav.plugins.cpu_platform.platform.CpuEnginePlatform"
    assert with_cuda is None and broken == alone


def test_vllm_omni_resolves_our_cpu_platform_with_both_worker_kinds() -> None:
    out = _run(
        """
import json
from vllm_omni.platforms import current_omni_platform as p
from vllm.utils.import_utils import resolve_obj_by_qualname
gen = resolve_obj_by_qualname(p.get_omni_generation_worker_cls())
ar = resolve_obj_by_qualname(p.get_omni_ar_worker_cls())
from vllm_omni.worker.omni_connector_model_runner_mixin import OmniConnectorModelRunnerMixin
print(json.dumps({"platform": type(p).__name__, "device": p.device_type, "oot": p.is_out_of_tree(),
                  "gen_runner": issubclass(gen.model_runner_cls, OmniConnectorModelRunnerMixin),
                  "ar_runner": issubclass(ar.model_runner_cls, OmniConnectorModelRunnerMixin),
                  "workers": [gen.__name__, ar.__name__]}))
"""
    )
    got = out["result"]
    assert got["platform"] == "CpuEnginePlatform" and got["device"] == "cpu" and got["oot"]
    assert got["gen_runner"] and got["ar_runner"]
    assert got["workers"] == ["CPUGenerationWorker", "CPUARWorker"]
