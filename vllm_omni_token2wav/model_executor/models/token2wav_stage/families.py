# SPDX-License-Identifier: Apache-2.0
"""What differs between the model families served by the Token2Wav stage, in one table, and their registry.

Each family's `FamilySpec` lives in its own folder (`step_audio2/family.py`, `minicpmo_4_5/family.py`,
`cosyvoice3/family.py`); `FAMILY_SPECS` below is the one table naming them (imported on first use).

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
`cosyvoice3/backend.py`): last chunk `stream_finished`; every chunk carries the whole token prefix
with `left_context_size` = where the new part starts (`prefix_offset_key`: the contract keeps
`prefix[left_context_size:]`, i.e. the 3 lookahead tokens again plus the new ones, the window the
other families send); a token-less payload with `finished` ends the stream (`end_marker_key`);
without stream meta a payload is a whole utterance (the sync path); the voice is the talker's
`embed.{speech_token, speech_feat, embedding}` or reference audio + `embed.speech_token`
(`voice_reader`: `cosyvoice3/voice.py`); assets in M itself (`cosyvoice3.yaml`-less folders work
too: `flow.pt`, `hift.pt`, `campplus.onnx`); default voice `default_voice.wav` + its tokens `default_voice.tokens`, or
`$COSYVOICE3_DEFAULT_PROMPT_WAV` (+ the `.tokens` file beside it); the audio leaves the stage under
`audio` (`output_key`; the other families: `model_outputs`, renamed by vLLM-Omni to their stage's
`engine_output_type`, which is `audio` for theirs but `latent` for upstream's CosyVoice3 code2wav).

Where the token2wav assets are (`resolve_token2wav_dir`), for the model folder M (`model_config.model`, or
the hub snapshot of the repo id it names: `model_source.py`, docs/design/token2wav_stage.md "Hub repo ids"): M itself
when it holds the asset files, else `M/token2wav` (Step-Audio2's layout), else `M/assets/token2wav`
(MiniCPM-o's). Default voice candidates, in order: the `prompt_wav` stage option, the family's
environment variable (if set and the file exists), then `M/assets/<name>`, `M/<name>`,
`<token2wav dir>/<name>`. None found is an error when the stage is built, listing the places.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead

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
    #: The asset files the family's core may read (beside the default voice): what is fetched from the hub
    #: when the model is a repo id (`model_source.hub_patterns`, in every layout). The default: the shared
    #: core's five files plus the minicpmo-utils 1.0.7 layout's causal-vocoder config and whole-utterance HiFT.
    hub_files: tuple[str, ...] = (
        "flow.yaml",
        "flow.pt",
        "hift.pt",
        "campplus.onnx",
        "speech_tokenizer_v2_25hz.onnx",
        "config.yaml",
        "hift_original.pt",
    )
    #: Chunks carry the whole token prefix and this meta key is where the new part starts (CosyVoice3's
    #: talker: `left_context_size`); the contract cuts the prefix there. None: chunks are sent as windows.
    prefix_offset_key: str | None = None
    #: A payload without tokens whose meta flag of this name is true ends the stream (CosyVoice3's
    #: terminal `finished`), even without stream meta.
    end_marker_key: str | None = None
    #: Reads a segment's voice from its dict instead of `voice.requested_voice` (CosyVoice3: prompt
    #: conditioning tensors or reference audio + its speech tokens).
    voice_reader: Callable[[Mapping[str, Any]], VoiceRequest | None] | None = None
    #: The `multimodal_outputs` key of the audio (`contract.build_output`). vLLM-Omni renames the runner's
    #: producer key `model_outputs` to the stage's `engine_output_type` (`outputs/mm_outputs.py`
    #: `MultimodalPayload.from_raw`), and its speech endpoint takes only `audio` / `model_outputs`
    #: (`entrypoints/openai/serving_speech.py`): upstream's CosyVoice3 pipeline declares `latent`, and
    #: upstream's CosyVoice3 stage returns `audio` itself, so ours does too.
    output_key: str = "model_outputs"

    def is_last(self, value: object) -> bool:
        """Interpret this family's last-chunk marker (bool, or Step-Audio2's 0/1 `left_context_size`)."""
        if self.last_chunk_key == "left_context_size":
            return int(value) == 1  # type: ignore[call-overload]
        return bool(value)

    @property
    def hub_download_files(self) -> tuple[str, ...]:
        """`hub_files` and the default voice files: every file the stage reads from the model's repo."""
        return tuple(dict.fromkeys((*self.hub_files, *self.default_voice_names)))


_MODELS = "vllm_omni_token2wav.model_executor.models"

#: The one registry of the families the stage serves: name -> (module, attribute) of the family's
#: `FamilySpec`, imported on first use. Each family's spec, backend, voice reader and stage class live
#: in its own folder, so this framework imports no family: a new family's code2wav is one folder and
#: one line here.
FAMILY_SPECS: Final[Mapping[str, tuple[str, str]]] = {
    "minicpmo_4_5": (f"{_MODELS}.minicpmo_4_5.family", "MINICPMO_4_5"),
    "step_audio2": (f"{_MODELS}.step_audio2.family", "STEP_AUDIO2"),
    "cosyvoice3": (f"{_MODELS}.cosyvoice3.family", "COSYVOICE3"),
}

#: The specs' constant names, readable here as `families.STEP_AUDIO2` & co. (module `__getattr__`).
_SPEC_CONSTANTS: Final[Mapping[str, str]] = {attr: name for name, (_, attr) in FAMILY_SPECS.items()}


def family_spec(name: str) -> FamilySpec:
    """The registered spec of family `name`; ValueError naming the known families otherwise."""
    try:
        module, attr = FAMILY_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown Token2Wav family {name!r}; registered: {', '.join(FAMILY_SPECS)}") from None
    spec = getattr(importlib.import_module(module), attr)
    if not isinstance(spec, FamilySpec) or spec.name != name:
        raise TypeError(f"{module}.{attr} must be the FamilySpec named {name!r}, got {spec!r:.80}")
    return spec


def __getattr__(name: str) -> FamilySpec:
    """`MINICPMO_4_5`, `STEP_AUDIO2`, `COSYVOICE3`: the registered specs under their constant names (PEP 562)."""
    family = _SPEC_CONSTANTS.get(name)
    if family is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return family_spec(family)


def resolve_token2wav_dir(
    model: str | os.PathLike[str], markers: tuple[str, ...] = TOKEN2WAV_MARKERS, *, source: str | None = None
) -> Path:
    """The token2wav folder for the model folder: the folder itself, `token2wav/` or `assets/token2wav/`.

    The first of them holding the flow and HiFT files (`markers`, the family's `asset_markers`) wins;
    when none does, the first existing `token2wav/` or `assets/token2wav/` folder is returned (the
    core's asset check then names the missing file), else FileNotFoundError listing the places.
    `model` is a folder (a hub repo id is resolved first, `model_source.py`); `source` names it in the
    error (e.g. the repo id, revision and snapshot folder).
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
        f"no token2wav assets for model {source or root}: looked for {', '.join(markers)} in {looked}; point "
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
    "FAMILY_SPECS",
    "TOKEN2WAV_MARKERS",
    "FamilySpec",
    "family_spec",
    "default_voice_candidates",
    "find_default_voice",
    "resolve_token2wav_dir",
]
