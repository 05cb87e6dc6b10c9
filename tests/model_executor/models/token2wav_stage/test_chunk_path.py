# SPDX-License-Identifier: Apache-2.0
"""The path of one streaming chunk, traced at run time: the folders docs/design/architecture.md names.

One middle chunk of a request goes through the real stage `forward` under `sys.setprofile`; every
package function it calls is recorded by its folder. The model folders on that path (everything under
`model_executor/models/` except the shared output template) must be exactly those the architecture
document lists for each family (Step-Audio2: four), so a move that makes the chunk zig-zag through another folder fails
here, not in a reader's head. Base layers (root utilities, `platforms/`) are not counted: they are
called from everywhere.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import vllm_omni_token2wav
from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks, forward_inputs
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

PACKAGE = Path(vllm_omni_token2wav.__file__).resolve().parent
MODELS = "model_executor/models"
LAYERS = "model_executor/layers"

#: The folders one chunk crosses, as docs/design/architecture.md "One streaming chunk's path" names them.
STEP_AUDIO2_PATH = {
    f"{MODELS}/token2wav_stage",
    f"{MODELS}/token2wav_core",
    f"{LAYERS}/flow",
    f"{LAYERS}/hift",
}
#: CosyVoice3's own four, plus the CosyVoice2 layer folders its DiT flow and causal HiFT are built from
#: (Euler CFG steps, ragged convolutions, the HiFT base and source) and the facade base its core subclasses
#: (`token2wav_core/facade.py`: the stage's `models_loaded`, the `load_models` fast path): shared building
#: blocks, no stop of their own.
COSYVOICE3_PATH = {
    f"{MODELS}/token2wav_stage",
    f"{MODELS}/cosyvoice3",
    f"{MODELS}/token2wav_core",
    f"{LAYERS}/flow_cosyvoice3",
    f"{LAYERS}/hift_causal",
    f"{LAYERS}/flow",
    f"{LAYERS}/hift",
}


def _folders_called(run: Callable[[], Any]) -> set[str]:
    """Folders (relative to the package) of every package function `run` calls, the driver excluded."""
    files: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            files.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    folders = set()
    for name in files:
        path = Path(name).resolve()
        if path.is_relative_to(PACKAGE):
            folders.add(path.parent.relative_to(PACKAGE).as_posix())
    return folders


def _model_folders(folders: set[str]) -> set[str]:
    # `model_executor/models` itself holds only the output template every stage returns.
    return {f for f in folders if f.startswith((f"{MODELS}/", f"{LAYERS}/"))}


def _middle_chunk_path(stage: Token2WavStageModel, stream: ProducerStream) -> set[str]:
    chunks = all_chunks(stream)
    assert len(chunks) >= 3, len(chunks)

    def forward(index: int) -> Callable[[], None]:
        input_ids, kwargs = forward_inputs([chunks[index]], stage.family)  # the driver, outside the traced call

        def call() -> None:
            assert segment_errors(stage(input_ids, None, **kwargs).multimodal_outputs) == [None]

        return call

    forward(0)()  # loads the models and the default voice: not part of a chunk's path
    return _folders_called(forward(1))


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(6561) for _ in range(n)]


def test_a_step_audio2_chunk_crosses_the_four_folders_the_architecture_names(model_dir: Path) -> None:
    stage = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)
    stream = ProducerStream("chunk-path", _tokens(80, seed=0), stage.family)
    folders = _middle_chunk_path(stage, stream)
    assert _model_folders(folders) == STEP_AUDIO2_PATH, sorted(folders)


def test_a_cosyvoice3_chunk_crosses_the_four_folders_the_architecture_names(cv3_dir: Path) -> None:
    stage = CosyVoice3Code2Wav(model=str(cv3_dir), device="cpu", n_timesteps=2)
    stage.load_weights([])
    prompt_tokens = stage.default_voice.tokens.shape[1]
    stream = ProducerStream("chunk-path", _tokens(80, seed=1), stage.family, prompt_tokens=prompt_tokens)
    folders = _middle_chunk_path(stage, stream)
    assert _model_folders(folders) == COSYVOICE3_PATH, sorted(_model_folders(folders))
