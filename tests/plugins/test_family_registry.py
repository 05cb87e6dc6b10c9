# SPDX-License-Identifier: Apache-2.0
"""The one family list and what derives from it (no engine started).

Every table the plugin, the stand-in folders and the CLI read is derived from
`token2wav_stage/families.py:FAMILY_MODULES` and each family's `family.py` record:

- the derived tables equal what the families declare, and (pinned here) what the hand-written tables held
  before they were derived, so serving is unchanged;
- every shipped deploy YAML is declared by exactly one family and names one of its pipelines;
- adding a family is its folder and one list line: with the toy family (`tests/plugins/toy_family/`) added to
  the list, every derived table grows by it, and no file of the package names it;
- reading the list imports no torch (the CLI's `--family` choices come from it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_token2wav.model_executor.models.token2wav_stage import families

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PACKAGE = Path(families.__file__).resolve().parents[3]
TOY_MODULE = "tests.plugins.toy_family.family"
MODELS = "vllm_omni_token2wav.model_executor.models"
PROC = "vllm_omni.model_executor.stage_input_processors"
STEP_AUDIO2_CLASS = f"{MODELS}.step_audio2.step_audio2_token2wav_stage:StepAudio2Token2WavForConditionalGeneration"


def _derived() -> dict[str, object]:
    from vllm_omni_token2wav.entrypoints.cli.token2wav import cli_families
    from vllm_omni_token2wav.model_executor.models.standin import model_dirs
    from vllm_omni_token2wav.plugins import overrides, pipelines

    return {
        "STAGE_OVERRIDES": overrides.STAGE_OVERRIDES,
        "ADDED_ARCHITECTURES": overrides.ADDED_ARCHITECTURES,
        "FAMILY_ARCHITECTURES": overrides.FAMILY_ARCHITECTURES,
        "FAMILY_PIPELINES": {
            name: (p.code2wav_arch, p.code2wav_stage, p.async_chunk_func, p.producer_stage)
            for name, p in pipelines.FAMILY_PIPELINES.items()
        },
        "STANDIN_STREAM_FAMILIES": pipelines.STANDIN_STREAM_FAMILIES,
        "ENGINE_FAMILIES": model_dirs.ENGINE_FAMILIES,
        "codec_offsets": {f: model_dirs.producer_codec_offset(f) for f in model_dirs.ENGINE_FAMILIES},
        "cli_families": cli_families(),
    }


#: The hand-written tables before they were derived from the family list (issue 31): serving must not change.
BEFORE = {
    "STAGE_OVERRIDES": {
        "MiniCPMO45Code2Wav": f"{MODELS}.minicpmo_4_5.minicpmo_4_5_code2wav:MiniCPMO45Code2Wav",
        "StepAudio2Token2WavForConditionalGeneration": STEP_AUDIO2_CLASS,
        "StepAudio2Token2WavModel": STEP_AUDIO2_CLASS,
        "CosyVoice3Model": f"{MODELS}.cosyvoice3.cosyvoice3_model:CosyVoice3Model",
    },
    "ADDED_ARCHITECTURES": {"Token2WavStandinProducer": f"{MODELS}.standin.producer:Token2WavStandinProducer"},
    "FAMILY_ARCHITECTURES": {
        "minicpmo_4_5": ("MiniCPMO45Code2Wav",),
        "step_audio2": ("StepAudio2Token2WavForConditionalGeneration", "StepAudio2Token2WavModel"),
        "cosyvoice3": ("CosyVoice3Model",),
    },
    "FAMILY_PIPELINES": {
        "minicpmo_4_5": ("MiniCPMO45Code2Wav", "code2wav", f"{PROC}.minicpmo_4_5_omni.tts2code2wav_async_chunk", "tts"),
        "step_audio2": (
            "StepAudio2Token2WavModel",
            "token2wav",
            f"{PROC}.step_audio2.thinker2token2wav_async_chunk",
            "step_audio2_thinker",
        ),
        "cosyvoice3": (
            "CosyVoice3Model",
            "cosyvoice3_code2wav",
            f"{PROC}.cosyvoice3.talker2code2wav_async_chunk",
            "standin_producer",
        ),
    },
    "STANDIN_STREAM_FAMILIES": ("step_audio2", "cosyvoice3"),
    "ENGINE_FAMILIES": ("minicpmo_4_5", "step_audio2", "cosyvoice3"),
    "codec_offsets": {"minicpmo_4_5": 0, "step_audio2": 151696, "cosyvoice3": 0},
    "cli_families": ("minicpmo_4_5", "step_audio2", "cosyvoice3"),
}


def test_the_derived_tables_are_what_the_families_declare_and_what_the_hand_written_tables_held() -> None:
    derived = _derived()
    assert derived == BEFORE
    for family in families.registered_families():
        for arch in family.serving.upstream_architectures:
            assert derived["STAGE_OVERRIDES"][arch] == family.serving.stage_class  # type: ignore[index]
        assert family.pipelines.code2wav_arch in family.architectures, family.name
        module, _, name = family.serving.stage_class.partition(":")
        assert (PACKAGE.parent / (module.replace(".", "/") + ".py")).is_file(), family.serving.stage_class
        assert f"class {name}(" in (PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text()


def test_the_stage_behaviour_facts_are_unchanged() -> None:
    from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead

    specs = families.FAMILY_SPECS
    assert (specs["minicpmo_4_5"].lookahead, specs["minicpmo_4_5"].conformer_trim) == (
        Lookahead.SILENCE,
        ConformerTrim.PROMPT_PLUS_TAIL,
    )
    assert (specs["step_audio2"].lookahead, specs["step_audio2"].conformer_trim) == (
        Lookahead.PROMPT_HEAD,
        ConformerTrim.NONE,
    )
    assert specs["cosyvoice3"].cosyvoice2_flow is None
    with pytest.raises(AttributeError, match="cosyvoice3 does not run the CosyVoice2 flow: it has no lookahead"):
        _ = specs["cosyvoice3"].lookahead
    reader = specs["cosyvoice3"].voice_reader
    assert reader is not None and reader({"codes": {"audio": [1, 2]}}) is None  # imported on first call


def test_every_shipped_deploy_yaml_belongs_to_one_family_and_names_its_pipeline() -> None:
    from vllm_omni_token2wav.deploy import DEPLOY_DIR

    declared = {name: f for f in families.registered_families() for name in f.pipelines.deploy_yamls}
    assert sorted(declared) == sorted(p.stem for p in DEPLOY_DIR.glob("*.yaml"))
    for name, family in declared.items():
        pipeline = re.search(r"^pipeline: (\S+)$", (DEPLOY_DIR / f"{name}.yaml").read_text(), re.M)
        assert pipeline is not None, name
        own = {f"{family.name}_code2wav"} | (
            {f"standin_{family.name}_stream"} if family.pipelines.standin_stream else set()
        )
        assert pipeline.group(1) in own, (name, pipeline.group(1))


def test_a_fourth_family_is_its_folder_and_one_list_line(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _derived()
    monkeypatch.setattr(families, "FAMILY_MODULES", (*families.FAMILY_MODULES, TOY_MODULE))  # the one line
    after = _derived()

    arch = "ToyToken2WavModel"
    assert after["STAGE_OVERRIDES"] == before["STAGE_OVERRIDES"]  # it replaces no upstream class
    assert after["ADDED_ARCHITECTURES"] == {
        **before["ADDED_ARCHITECTURES"],  # type: ignore[dict-item]
        arch: "tests.plugins.toy_family.toy_token2wav:ToyToken2Wav",
    }
    assert after["FAMILY_ARCHITECTURES"] == {**before["FAMILY_ARCHITECTURES"], "toy_token2wav": ()}  # type: ignore[dict-item]
    assert after["FAMILY_PIPELINES"]["toy_token2wav"] == (  # type: ignore[index]
        arch,
        "toy_token2wav",
        f"{PROC}.step_audio2.thinker2token2wav_async_chunk",
        "toy_thinker",
    )
    assert after["STANDIN_STREAM_FAMILIES"] == before["STANDIN_STREAM_FAMILIES"]
    assert after["ENGINE_FAMILIES"] == (*before["ENGINE_FAMILIES"], "toy_token2wav")  # type: ignore[misc]
    assert after["codec_offsets"]["toy_token2wav"] == 0  # type: ignore[index]
    assert after["cli_families"] == (*before["cli_families"], "toy_token2wav")  # type: ignore[misc]
    assert families.TOY_TOKEN2WAV is families.family_spec("toy_token2wav")
    assert families.TOY_TOKEN2WAV.lookahead.value == "prompt_head"

    stage_class = families.import_target(families.family("toy_token2wav").serving.stage_class)
    assert stage_class.family is families.TOY_TOKEN2WAV
    # Nothing in the package names the toy: the list line (here) and its folder are all it took.
    hits = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "toy_token2wav" in (text := path.read_text()) or arch in text
    ]
    assert hits == []


def test_out_of_tree_families_come_from_the_environment_and_bad_ones_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_omni_token2wav import envs

    monkeypatch.setenv(envs.EXTRA_FAMILIES_ENV, f" {TOY_MODULE} ,")
    assert [f.name for f in families.registered_families()][-1] == "toy_token2wav"
    monkeypatch.setenv(envs.EXTRA_FAMILIES_ENV, "vllm_omni_token2wav.envs")
    with pytest.raises(TypeError, match="vllm_omni_token2wav.envs.FAMILY must be a families.Family record"):
        families.registered_families()
    monkeypatch.setattr(families, "FAMILY_MODULES", (*families.FAMILY_MODULES, families.FAMILY_MODULES[0]))
    monkeypatch.delenv(envs.EXTRA_FAMILIES_ENV)
    assert len(families.registered_families()) == 3  # a repeated line counts once


def test_a_family_whose_name_or_architecture_clashes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import types

    step_audio2 = families.family("step_audio2")
    clone = types.ModuleType("clone_family")
    clone.FAMILY = dataclasses.replace(step_audio2, spec=dataclasses.replace(step_audio2.spec, name="clone"))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "clone_family", clone)
    monkeypatch.setattr(families, "FAMILY_MODULES", (*families.FAMILY_MODULES, "clone_family"))
    with pytest.raises(ValueError, match="family 'clone' clashes with 'step_audio2'.*StepAudio2Token2WavModel"):
        families.registered_families()


def test_reading_the_family_list_imports_no_torch_and_no_family_code() -> None:
    code = (
        "import sys\n"
        "from vllm_omni_token2wav.entrypoints.cli.token2wav import cli_families\n"
        "from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import registered_families\n"
        "registered_families(); cli_families()\n"
        "models = 'vllm_omni_token2wav.model_executor.models.'\n"
        "family_code = [m for m in sys.modules if m.startswith(models) and m.count('.') > 3\n"
        "               and not m.endswith('.family') and not m.startswith(models + 'token2wav_stage')]\n"
        "print(sorted(set(sys.modules) & {'torch', 'vllm', 'vllm_omni'}) + family_code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
