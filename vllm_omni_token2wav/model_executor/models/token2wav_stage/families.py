# SPDX-License-Identifier: Apache-2.0
"""What differs between the model families served by the Token2Wav stage, in one table.

MiniCPM-o 4.5 and Step-Audio2 ship the same token2wav assets and run the same flow + HiFT, but
their producers and upstream stage models differ in a handful of facts. The engine, the state
machine and the planner are written once; a `FamilySpec` carries the differences:

| fact                        | MiniCPM-o 4.5 (`MINICPMO_4_5`)      | Step-Audio2 (`STEP_AUDIO2`)                 |
|-----------------------------|-------------------------------------|---------------------------------------------|
| last-chunk marker in `meta` | `last_chunk` (bool)                 | `left_context_size` (1 = last, 0 = not)     |
| payload without stream meta | a one-chunk stream (MiniCPM-o       | a whole utterance (bidirectional flow),     |
| (and, in a sync deployment, | streams every reply)                | upstream's sync path                        |
| no payload: the request's   |                                     |                                             |
| tokens are its whole input) |                                     |                                             |
| prompt lookahead at set-up  | 3 silence tokens (4218)             | the prompt's first 3 tokens                 |
| conformer cache trimming    | prompt + 100 frames                 | none (streams end at ~94 s, clear error)    |
| default voice file          | `HT_ref_audio.wav`                  | `default_female.wav`, or the file named by  |
|                             |                                     | `$STEP_AUDIO2_DEFAULT_PROMPT_WAV`           |

(MiniCPM-o's producer also sends `left_context_size`, meaning the number of context tokens it
prepended; only Step-Audio2's uses it as the last-chunk marker, hence a per-family key.)

What a segment without producer payload is does not depend on the family but on the deployment
(`StageOptions.async_chunk`, vLLM-Omni's `model_config.async_chunk`; `contract.py`): in an async-chunk
pipeline it is the engine's pre-warm placeholder (empty output, every family); in a sync deployment
(code2wav alone, a pipeline's sync path) its tokens are the whole request, served as the row above
says, unless they are empty or all zero (a placeholder).

CosyVoice3 (`COSYVOICE3`, vLLM-Omni 0.30's talker -> code2wav; its own flow and vocoder, see
`cosyvoice3_backend.py`): last chunk `stream_finished`; every chunk carries the whole token prefix
with `left_context_size` = where the new part starts (`prefix_offset_key`: the contract keeps
`prefix[left_context_size:]`, i.e. the 3 lookahead tokens again plus the new ones, the window the
other families send); a token-less payload with `finished` ends the stream (`end_marker_key`);
without stream meta a payload is a whole utterance (the sync path); the voice is the talker's
`embed.{speech_token, speech_feat, embedding}` or reference audio + `embed.speech_token`
(`voice_reader`); assets in M itself (`cosyvoice3.yaml`-less folders work too: `flow.pt`, `hift.pt`,
`campplus.onnx`); default voice `default_voice.wav` + its tokens `default_voice.tokens`, or
`$COSYVOICE3_DEFAULT_PROMPT_WAV` (+ the `.tokens` file beside it).

Where the token2wav assets are (`resolve_token2wav_dir`), for `model_config.model` = M: M itself
when it holds the asset files, else `M/token2wav` (Step-Audio2's layout), else `M/assets/token2wav`
(MiniCPM-o's). Default voice candidates, in order: the `prompt_wav` stage option, the family's
environment variable (if set and the file exists), then `M/assets/<name>`, `M/<name>`,
`<token2wav dir>/<name>`. None found is an error when the stage is built, listing the places.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_omni_token2wav.model_executor.models.cosyvoice2.flow import ConformerTrim, Lookahead

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest

#: Files whose presence makes a folder a token2wav folder (the flow config and weights).
TOKEN2WAV_MARKERS = ("flow.yaml", "flow.pt", "hift.pt")


@dataclass(frozen=True)
class FamilySpec:
    """The per-family facts of the module docstring's table."""

    name: str
    last_chunk_key: str
    #: A segment with a payload but no stream meta is a whole utterance (True) or a one-chunk stream.
    whole_without_stream_meta: bool
    lookahead: Lookahead
    conformer_trim: ConformerTrim
    default_voice_names: tuple[str, ...]
    default_voice_env: str | None = None
    #: Files whose presence makes a folder this family's asset folder (`resolve_token2wav_dir`).
    asset_markers: tuple[str, ...] = ("flow.yaml", "flow.pt", "hift.pt")
    #: Chunks carry the whole token prefix and this meta key is where the new part starts (CosyVoice3's
    #: talker: `left_context_size`); the contract cuts the prefix there. None: chunks are sent as windows.
    prefix_offset_key: str | None = None
    #: A payload without tokens whose meta flag of this name is true ends the stream (CosyVoice3's
    #: terminal `finished`), even without stream meta.
    end_marker_key: str | None = None
    #: Reads a segment's voice from its dict instead of `voice.requested_voice` (CosyVoice3: prompt
    #: conditioning tensors or reference audio + its speech tokens).
    voice_reader: Callable[[Mapping[str, Any]], VoiceRequest | None] | None = None

    def is_last(self, value: object) -> bool:
        """Interpret this family's last-chunk marker (bool, or Step-Audio2's 0/1 `left_context_size`)."""
        if self.last_chunk_key == "left_context_size":
            return int(value) == 1  # type: ignore[call-overload]
        return bool(value)


MINICPMO_4_5 = FamilySpec(
    name="minicpmo_4_5",
    last_chunk_key="last_chunk",
    whole_without_stream_meta=False,
    lookahead=Lookahead.SILENCE,
    conformer_trim=ConformerTrim.PROMPT_PLUS_TAIL,
    default_voice_names=("HT_ref_audio.wav",),
)

STEP_AUDIO2 = FamilySpec(
    name="step_audio2",
    last_chunk_key="left_context_size",
    whole_without_stream_meta=True,
    lookahead=Lookahead.PROMPT_HEAD,
    conformer_trim=ConformerTrim.NONE,
    default_voice_names=("default_female.wav",),
    default_voice_env="STEP_AUDIO2_DEFAULT_PROMPT_WAV",
)


def _cosyvoice3_voice(info: Mapping[str, Any]) -> VoiceRequest | None:
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.voice import read_voice

    return read_voice(info)


COSYVOICE3 = FamilySpec(
    name="cosyvoice3",
    last_chunk_key="stream_finished",
    whole_without_stream_meta=True,
    # Not used: CosyVoice3's flow has neither a conformer nor a prompt lookahead at set-up.
    lookahead=Lookahead.PROMPT_HEAD,
    conformer_trim=ConformerTrim.NONE,
    default_voice_names=("default_voice.wav",),
    default_voice_env="COSYVOICE3_DEFAULT_PROMPT_WAV",
    asset_markers=("flow.pt", "hift.pt", "campplus.onnx"),
    prefix_offset_key="left_context_size",
    end_marker_key="finished",
    voice_reader=_cosyvoice3_voice,
)


def resolve_token2wav_dir(model: str | os.PathLike[str], markers: tuple[str, ...] = TOKEN2WAV_MARKERS) -> Path:
    """The token2wav folder for `model_config.model`: the folder itself, `token2wav/` or `assets/token2wav/`.

    The first of them holding the flow and HiFT files (`markers`, the family's `asset_markers`) wins;
    when none does, the first existing `token2wav/` or `assets/token2wav/` folder is returned (the
    core's asset check then names the missing file), else FileNotFoundError listing the places.
    """
    root = Path(model)
    candidates = [root, root / "token2wav", root / "assets" / "token2wav"]
    for folder in candidates:
        if folder.is_dir() and all((folder / name).is_file() for name in markers):
            return folder
    for folder in candidates[1:]:
        if folder.is_dir():
            return folder
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"no token2wav assets for model {root}: looked for {', '.join(markers)} in {looked}; point "
        "model_config.model at the model folder (Step-Audio2: token2wav/ inside it, MiniCPM-o: assets/token2wav/)"
    )


def default_voice_candidates(
    family: FamilySpec, model: str | os.PathLike[str], token2wav_dir: Path, override: str | None = None
) -> list[Path]:
    """Where the family's default voice may be, in lookup order (see the module docstring)."""
    root = Path(model)
    out: list[Path] = []
    if override:
        out.append(Path(override))
    if family.default_voice_env:
        value = os.environ.get(family.default_voice_env)
        if value:
            out.append(Path(value))
    for name in family.default_voice_names:
        out += [root / "assets" / name, root / name, token2wav_dir / name]
    unique: list[Path] = []
    for path in out:
        if path not in unique:
            unique.append(path)
    return unique


def find_default_voice(
    family: FamilySpec, model: str | os.PathLike[str], token2wav_dir: Path, override: str | None = None
) -> Path:
    """The first existing default-voice candidate; FileNotFoundError listing all of them otherwise."""
    candidates = default_voice_candidates(family, model, token2wav_dir, override)
    for path in candidates:
        if path.is_file():
            return path
    hint = f"set {family.default_voice_env} or " if family.default_voice_env else ""
    raise FileNotFoundError(
        f"{family.name} token2wav stage: no default voice; looked for {', '.join(str(p) for p in candidates)}. "
        f"{hint}pass the stage option prompt_wav=<file>, or put {family.default_voice_names[0]} in the model folder"
    )


__all__ = [
    "COSYVOICE3",
    "MINICPMO_4_5",
    "STEP_AUDIO2",
    "TOKEN2WAV_MARKERS",
    "FamilySpec",
    "default_voice_candidates",
    "find_default_voice",
    "resolve_token2wav_dir",
]
