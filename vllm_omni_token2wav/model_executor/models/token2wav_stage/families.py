# SPDX-License-Identifier: Apache-2.0
"""What differs between the model families served by the Token2Wav stage, and THE list of families.

Every fact about a family lives in its own folder's `family.py` as one `Family` record (`FAMILY`):

| part              | what it holds                                          | read by                                 |
|-------------------|--------------------------------------------------------|-----------------------------------------|
| `spec`            | `FamilySpec`: how its producer's chunks read, default  | the stage (`contract.py`,               |
|                   | voice, asset files, output key; CosyVoice2-flow rules  | `stage_model.py`, `token2wav_core/`)    |
|                   | in the optional `cosyvoice2_flow` part                 |                                         |
| `serving`         | `StageServing`: our stage class ("module:Class") and   | `plugins/overrides.py`                  |
|                   | the upstream architecture names it replaces or adds    | (`STAGE_OVERRIDES` & co.)               |
| `pipelines`       | `PipelineFacts`: how upstream's pipeline names/feeds   | `plugins/pipelines.py`,                 |
|                   | its code2wav stage, the shipped deploy YAMLs           | `deploy/`                               |
| `standin`         | `StandinLayout`: the stand-in engine folder's layout   | `standin/model_dirs.py`                 |
| `producer`        | `ProducerShape`: how its producer cuts chunks and the  | `standin/chunk_producer.py` (emulated   |
|                   | meta keys it sends                                     | producer), stand-in producer folder     |
| `cli_name`        | its `vllm-omni-token2wav token2wav --family` choice    | `entrypoints/cli/token2wav.py`          |

`FAMILY_MODULES` below is THE list: one line per family (its `family.py` module); every table above is
derived from it (`registered_families()`), and `VLLM_OMNI_TOKEN2WAV_EXTRA_FAMILIES` (`envs.py`) appends
out-of-tree families (a comma list of modules defining `FAMILY`; read in every process, so engine workers
see them too). Family records hold strings and small dataclasses only: reading the list imports no torch,
no vLLM and no family code (stage classes, voice readers and pipeline functions are "module:name" strings).

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
| (`cosyvoice2_flow`)         |                                     |                                             |
| conformer cache trimming    | prompt + 100 frames                 | none (streams end at ~94 s, clear error)    |
| (`cosyvoice2_flow`)         |                                     |                                             |
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
`cosyvoice3/backend.py`, so no `cosyvoice2_flow` part): last chunk `stream_finished`; every chunk carries
the whole token prefix with `left_context_size` = where the new part starts (`prefix_offset_key`: the
contract keeps `prefix[left_context_size:]`, i.e. the 3 lookahead tokens again plus the new ones, the window
the other families send); a token-less payload with `finished` ends the stream (`end_marker_key`);
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

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest

#: Files whose presence makes a folder a token2wav folder (the flow config and weights).
TOKEN2WAV_MARKERS = ("flow.yaml", "flow.pt", "hift.pt")


@functools.cache
def import_target(target: str) -> Any:
    """The object a "package.module:name" string names (imported on first use, then cached)."""
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{target!r} is not a 'package.module:name' string")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError:
        raise ImportError(f"{target!r}: module {module} has no attribute {name!r}") from None


@dataclass(frozen=True)
class ImportedFunction:
    """A function named by a "module:function" string, imported on its first call (keeps `family.py` light)."""

    target: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return import_target(self.target)(*args, **kwargs)


@dataclass(frozen=True)
class CosyVoice2FlowRules:
    """The stream rules of a family on the CosyVoice2 flow + HiFT (the shared core, `token2wav_core/`).

    Values of `layers/flow/streaming.py`'s `Lookahead` / `ConformerTrim`, kept as their strings so that
    reading a family imports no model code; `lookahead_rule` / `trim_rule` give the enums.
    """

    lookahead: Literal["included", "prompt_head", "silence"]
    conformer_trim: Literal["none", "prompt_plus_tail", "per_rate"]

    @property
    def lookahead_rule(self) -> Lookahead:
        from vllm_omni_token2wav.model_executor.layers.flow import Lookahead

        return Lookahead(self.lookahead)

    @property
    def trim_rule(self) -> ConformerTrim:
        from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim

        return ConformerTrim(self.conformer_trim)


@dataclass(frozen=True)
class FamilySpec:
    """The per-family facts the stage reads (the module docstring's tables)."""

    name: str
    last_chunk_key: str
    #: A segment with a payload but no stream meta is a whole utterance (True) or a one-chunk stream.
    whole_without_stream_meta: bool
    default_voice_names: tuple[str, ...]
    default_voice_env: str | None = None
    #: Families on the shared CosyVoice2 flow + HiFT core: their stream rules. None: the family brings
    #: its own flow (CosyVoice3), and `lookahead` / `conformer_trim` are not defined for it.
    cosyvoice2_flow: CosyVoice2FlowRules | None = None
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
    #: conditioning tensors or reference audio + its speech tokens); an `ImportedFunction` in `family.py`.
    voice_reader: Callable[[Mapping[str, Any]], VoiceRequest | None] | None = None
    #: The `multimodal_outputs` key of the audio (`contract.build_output`). vLLM-Omni renames the runner's
    #: producer key `model_outputs` to the stage's `engine_output_type` (`outputs/mm_outputs.py`
    #: `MultimodalPayload.from_raw`), and its speech endpoint takes only `audio` / `model_outputs`
    #: (`vllm_omni/entrypoints/openai/serving_speech.py`): upstream's CosyVoice3 pipeline declares `latent`, and
    #: upstream's CosyVoice3 stage returns `audio` itself, so ours does too.
    output_key: str = "model_outputs"

    def is_last(self, value: object) -> bool:
        """Interpret this family's last-chunk marker (bool, or Step-Audio2's 0/1 `left_context_size`)."""
        if self.last_chunk_key == "left_context_size":
            return int(value) == 1  # type: ignore[call-overload]
        return bool(value)

    def _flow_rules(self, what: str) -> CosyVoice2FlowRules:
        if self.cosyvoice2_flow is None:
            raise AttributeError(f"family {self.name} does not run the CosyVoice2 flow: it has no {what}")
        return self.cosyvoice2_flow

    @property
    def lookahead(self) -> Lookahead:
        """The prompt lookahead at stream set-up (CosyVoice2-flow families only)."""
        return self._flow_rules("lookahead").lookahead_rule

    @property
    def conformer_trim(self) -> ConformerTrim:
        """The conformer cache trimming of a stream (CosyVoice2-flow families only)."""
        return self._flow_rules("conformer_trim").trim_rule

    @property
    def hub_download_files(self) -> tuple[str, ...]:
        """`hub_files` and the default voice files: every file the stage reads from the model's repo."""
        return tuple(dict.fromkeys((*self.hub_files, *self.default_voice_names)))


@dataclass(frozen=True)
class StageServing:
    """What makes vLLM-Omni build our stage class for this family (`plugins/overrides.py`)."""

    #: Our stage class, "package.module:Class" (imported by vLLM's registry only when a stage is built).
    stage_class: str
    #: Upstream architecture names our class replaces (`STAGE_OVERRIDES`; `VLLM_OMNI_TOKEN2WAV_OVERRIDES` picks).
    upstream_architectures: tuple[str, ...] = ()
    #: Architecture names upstream does not use, always registered (`ADDED_ARCHITECTURES`).
    added_architectures: tuple[str, ...] = ()
    #: The family's Token2Wav facade outside the engine, "package.module:Class" (a `Token2WavFacade`
    #: subclass: the `vllm-omni-token2wav token2wav` command and the benchmarks build it).
    facade_class: str | None = None


@dataclass(frozen=True)
class PipelineFacts:
    """How upstream's pipeline of the family names and feeds its code2wav stage (`plugins/pipelines.py`)."""

    #: The architecture the code2wav stage is built under (one of `StageServing`'s names).
    code2wav_arch: str
    #: The code2wav stage's `model_stage` name.
    code2wav_stage: str
    #: Upstream's async-chunk function feeding the code2wav stage, "package.module.function".
    async_chunk_func: str
    #: The producer stage's `model_stage` name (the speech endpoint picks its adapter by it).
    producer_stage: str
    #: The stand-in producer can feed the stage (`standin_<family>_stream`): upstream's async-chunk function
    #: reads the codes from the producer's token ids (not MiniCPM-o's: its talker's multimodal output).
    standin_stream: bool = False
    #: The shipped deploy YAMLs (`vllm_omni_token2wav/deploy/<name>.yaml`) of this family's pipelines.
    deploy_yamls: tuple[str, ...] = ()
    #: vLLM-Omni's own deploy YAML for the model (`vllm_omni/deploy/<name>`) and its code2wav stage's id: where
    #: `bench engine-ab` reads the code2wav `max_num_seqs` upstream's deployment uses.
    upstream_deploy: tuple[str, int] | None = None


@dataclass(frozen=True)
class StandinLayout:
    """The family's stand-in engine model folder (`standin/model_dirs.py`), laid out as its real folder."""

    #: Where the token2wav assets sit in the real folder ("" = the folder itself).
    asset_subdir: str
    #: Which stand-in asset set: the shared core's token2wav folder or CosyVoice3's.
    assets: Literal["token2wav", "cosyvoice3"] = "token2wav"
    #: The root `config.json`: a minimal Qwen2 config naming this architecture, with a marker weight file;
    #: None: `{}` and no weights (CosyVoice3's real folder: vLLM-Omni patches in its config).
    root_config_arch: str | None = None
    #: Asset files also copied into `assets/` (MiniCPM-o's default voice is `assets/HT_ref_audio.wav`).
    assets_copies: tuple[str, ...] = ()
    #: A tokenizer subfolder the real folder has (CosyVoice3's `CosyVoice-BlankEN/`), or None.
    tokenizer_subdir: str | None = None
    #: Codec ids in the stand-in producer's vocabulary start here (Step-Audio2: after its text vocabulary).
    producer_codec_offset: int = 0


@dataclass(frozen=True)
class ProducerShape:
    """How the family's producer cuts a reply into chunks and what it sends with each (the emulated producer).

    `chunking`: `context_window` = `[3 context | 25 new]`, the first context three silence codes, the last
    chunk the context plus the rest (MiniCPM-o); `lookahead_window` = `25 + 3 lookahead`, advancing by 25,
    the last chunk everything left (Step-Audio2); `growing_prefix` = the whole prefix every time with its
    offset, hops 25 (+ the prompt's padding), then x2 up to 100, an empty `finished` chunk for an empty reply
    (CosyVoice3). `meta_keys`: the meta keys each chunk carries, from the vocabulary `request_id`, `req_id`
    (one-element list), `chunk_seq`, `cache_epoch`, `last_chunk`, `code_flat_numel`, `finished`,
    `stream_finished` and `left_context_size` (the last-chunk 0/1 marker, or the prefix offset when the
    family's `prefix_offset_key` names it).
    """

    chunking: Literal["context_window", "lookahead_window", "growing_prefix"]
    meta_keys: tuple[str, ...]


@dataclass(frozen=True)
class Family:
    """Every fact about one family, declared once in its folder's `family.py` as `FAMILY`."""

    spec: FamilySpec
    serving: StageServing
    pipelines: PipelineFacts
    standin: StandinLayout
    producer: ProducerShape
    #: Its `vllm-omni-token2wav token2wav --family` choice, or None (e.g. MiniCPM-o: `step_audio2` serves its
    #: assets, the same core).
    cli_name: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def architectures(self) -> tuple[str, ...]:
        """Every architecture name our stage class is registered under for this family."""
        return (*self.serving.upstream_architectures, *self.serving.added_architectures)


_MODELS = "vllm_omni_token2wav.model_executor.models"

#: THE list of the families the stage serves: each line a family's `family.py` (defining `FAMILY`). Overrides,
#: pipelines, stand-in folders, the emulated producer and the CLI choices derive from it; a new family is its
#: folder and one line here.
FAMILY_MODULES: Final[tuple[str, ...]] = (
    f"{_MODELS}.minicpmo_4_5.family",
    f"{_MODELS}.step_audio2.family",
    f"{_MODELS}.cosyvoice3.family",
)


def family_modules() -> tuple[str, ...]:
    """`FAMILY_MODULES` and the out-of-tree ones of `VLLM_OMNI_TOKEN2WAV_EXTRA_FAMILIES` (`envs.py`)."""
    from vllm_omni_token2wav import envs

    return tuple(dict.fromkeys((*FAMILY_MODULES, *envs.extra_family_modules())))


@functools.cache
def _load(modules: tuple[str, ...]) -> tuple[Family, ...]:
    out: list[Family] = []
    for module in modules:
        family = getattr(importlib.import_module(module), "FAMILY", None)
        if not isinstance(family, Family):
            raise TypeError(f"{module}.FAMILY must be a families.Family record, got {family!r:.80}")
        clash = [f for f in out if f.name == family.name or set(f.architectures) & set(family.architectures)]
        if clash:
            raise ValueError(
                f"{module}: family {family.name!r} clashes with {clash[0].name!r} (same name or architecture "
                f"{sorted(set(clash[0].architectures) & set(family.architectures))}); names must be unique"
            )
        out.append(family)
    return tuple(out)


def registered_families() -> tuple[Family, ...]:
    """Every registered family's record, in list order (imports the `family.py` modules, nothing heavier)."""
    return _load(family_modules())


def family(name: str) -> Family:
    """The registered record of family `name`; ValueError naming the known families otherwise."""
    families = registered_families()
    for entry in families:
        if entry.name == name:
            return entry
    raise ValueError(f"unknown Token2Wav family {name!r}; registered: {', '.join(f.name for f in families)}")


def family_spec(name: str) -> FamilySpec:
    """The registered spec of family `name`; ValueError naming the known families otherwise."""
    return family(name).spec


def producer_shape(spec: FamilySpec) -> ProducerShape:
    """How the producer of the family of `spec` chunks and what meta it sends (for code handed a spec only)."""
    return family(spec.name).producer


def __getattr__(name: str) -> Any:
    """`FAMILY_SPECS` (name -> spec) and the specs as `MINICPMO_4_5`, `STEP_AUDIO2`, `COSYVOICE3` (PEP 562)."""
    if name == "FAMILY_SPECS":
        return {f.name: f.spec for f in registered_families()}
    if name.isupper():
        for entry in registered_families():
            if entry.name.upper() == name:
                return entry.spec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "FAMILY_MODULES",
    "TOKEN2WAV_MARKERS",
    "CosyVoice2FlowRules",
    "Family",
    "FamilySpec",
    "ImportedFunction",
    "PipelineFacts",
    "ProducerShape",
    "StageServing",
    "StandinLayout",
    "family",
    "family_modules",
    "family_spec",
    "import_target",
    "producer_shape",
    "registered_families",
    "default_voice_candidates",
    "find_default_voice",
    "resolve_token2wav_dir",
]
