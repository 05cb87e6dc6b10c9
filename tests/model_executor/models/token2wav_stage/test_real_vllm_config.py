# SPDX-License-Identifier: Apache-2.0
"""The stage models built from a real `vllm.config.VllmConfig`, as vLLM's model loader builds them.

Registered with vLLM's `ModelRegistry` (what an out-of-tree plugin does), accepted by a real
`ModelConfig` as a generate-runner model, constructed under vLLM's `set_default_torch_dtype(bf16)`
with `load_format=dummy` (no `load_weights`), then served one step. Nothing in the stage imports
vLLM; this only checks that the attributes it reads exist where it reads them.

vLLM is installed CPU-only by `tools/install_engine_cpu.sh` (run by `tools/dev_setup.sh`). The module
is skipped, with the reason, where vLLM or one of the packages that script installs is missing;
under CI (`CI` set) that is an error instead, so these tests never skip silently there.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.helpers.engine import require_engine
from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks, forward_inputs
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

require_engine("the real-VllmConfig stage tests", omni=False)

# A tiny HF config vLLM can parse; the architecture is the stage model under test.
_HF_CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 6561,
    "max_position_embeddings": 4096,
}


@pytest.fixture(scope="module")
def vllm_config_module() -> Iterator[ModuleType]:
    """`vllm.config`, imported once; the environment and warning filters it changes are restored afterwards."""
    environ, filters = dict(os.environ), list(warnings.filters)
    import vllm.config
    from vllm import ModelRegistry

    vllm.config.VllmConfig(device_config=vllm.config.DeviceConfig(device="cpu"))
    for cls in (MiniCPMO45Code2Wav, StepAudio2Token2WavForConditionalGeneration, CosyVoice3Code2Wav):
        ModelRegistry.register_model(cls.__name__, cls)
    yield vllm.config
    os.environ.clear()
    os.environ.update(environ)
    warnings.filters[:] = filters


def _vllm_config(config: ModuleType, folder: Path, arch: str) -> object:
    (folder / "config.json").write_text(json.dumps({**_HF_CONFIG, "architectures": [arch]}))
    model = config.ModelConfig(model=str(folder), skip_tokenizer_init=True, dtype="bfloat16")
    return config.VllmConfig(
        model_config=model,
        device_config=config.DeviceConfig(device="cpu"),
        load_config=config.LoadConfig(load_format="dummy"),
    )


@pytest.mark.parametrize("stage_cls", [MiniCPMO45Code2Wav, StepAudio2Token2WavForConditionalGeneration])
def test_a_real_vllm_config_builds_and_serves_the_stage(
    stage_cls: type, vllm_config_module: ModuleType, model_dir: Path, tmp_path: Path
) -> None:
    from vllm.utils.torch_utils import set_default_torch_dtype

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "token2wav").symlink_to(model_dir / "token2wav")
    cfg = _vllm_config(vllm_config_module, folder, stage_cls.__name__)
    assert cfg.model_config.architectures == [stage_cls.__name__]  # type: ignore[attr-defined]
    with set_default_torch_dtype(cfg.model_config.dtype):  # type: ignore[attr-defined]
        stage = stage_cls(vllm_config=cfg, prefix="", **{k: v for k, v in FAST_OPTIONS.items() if k != "device"})
        assert torch.get_default_dtype() == torch.bfloat16
    opts = stage.options
    assert opts.model == str(folder) and stage.token2wav.model_path == folder / "token2wav"
    assert str(stage.token2wav.device) == "cpu" and opts.load_format == "dummy"
    assert opts.max_rows == cfg.scheduler_config.max_num_seqs  # type: ignore[attr-defined]
    assert not stage.token2wav.models_loaded  # dummy load: no load_weights, built on the first real step
    chunks = all_chunks(ProducerStream("r", list(range(10, 50)), stage.family))
    input_ids, kwargs = forward_inputs(chunks[:1], stage.family)
    out = stage(input_ids, torch.arange(input_ids.numel()), **kwargs).multimodal_outputs
    assert segment_errors(out) == [None] and out["model_outputs"][0].dtype == torch.float32
    assert out["model_outputs"][0].numel() == 25 * 960 - 3840


def test_a_real_vllm_config_builds_and_serves_the_cosyvoice3_stage(
    vllm_config_module: ModuleType, cv3_dir: Path, tmp_path: Path
) -> None:
    from vllm.utils.torch_utils import set_default_torch_dtype

    folder = tmp_path / "Fun-CosyVoice3"
    folder.mkdir()
    for item in cv3_dir.iterdir():
        if not item.name.startswith("."):
            (folder / item.name).symlink_to(item)
    cfg = _vllm_config(vllm_config_module, folder, CosyVoice3Code2Wav.__name__)
    with set_default_torch_dtype(cfg.model_config.dtype):  # type: ignore[attr-defined]
        stage = CosyVoice3Code2Wav(vllm_config=cfg, prefix="", n_timesteps=2)
    assert stage.token2wav.model_path == folder and not stage.token2wav.models_loaded
    prompt_tokens = stage.default_voice.tokens.shape[1]
    chunks = all_chunks(ProducerStream("r", list(range(10, 50)), stage.family, prompt_tokens=prompt_tokens))
    input_ids, kwargs = forward_inputs(chunks[:1], stage.family)
    out = stage(input_ids, torch.arange(input_ids.numel()), **kwargs).multimodal_outputs
    assert (
        segment_errors(out) == [None] and out["audio"][0].dtype == torch.float32
    )  # CosyVoice3: `audio` (FamilySpec.output_key)
    assert stage.token2wav.flow.dtype == torch.float32  # built fp32 although vLLM's default dtype was bf16
    hop = 25 + (-prompt_tokens) % 25
    assert out["audio"][0].numel() == (2 * hop - 8) * 480
