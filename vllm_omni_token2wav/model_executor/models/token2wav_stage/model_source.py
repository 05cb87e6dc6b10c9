# SPDX-License-Identifier: Apache-2.0
"""`model_config.model` as a folder on disk: a local folder as given, a Hugging Face repo id through the hub cache.

`vllm-omni serve openbmb/MiniCPM-o-4_5 --omni` leaves the repo id in `model_config.model` (vLLM resolves
its own weights later, in its loader). The stage needs a folder: its token2wav assets and default voice
are files of the same repo. `resolve_model_source` gives it one, by the rules upstream's stage classes
follow (vLLM-Omni 0.30.0 wheel):

- `step_audio2/step_audio2_token2wav.py` `StepAudio2Token2WavForConditionalGeneration.__init__` (lines
  459-467): `os.path.isdir(model)` wins, else `hf_api().snapshot_download(model)` (no revision, the
  whole repo), then `<snapshot>/token2wav`; the default voice in `<snapshot>/assets/` or `<snapshot>/`
  (`_resolve_prompt_wav`, lines 491-510).
- `minicpmo_4_5/minicpmo_4_5_code2wav.py` `_resolve_model_dir` (lines 35-46): `Path(model).is_dir()` wins,
  else `snapshot_download(model, revision=model_config.revision, allow_patterns=["assets/*"])` on first use
  (`_build_backend`, line 1001), then `<snapshot>/assets/token2wav` and `<snapshot>/assets/HT_ref_audio.wav`.
- `vllm_omni/model_executor/models/cosyvoice3/cosyvoice3.py` `CosyVoice3Model.__init__` (lines 498-501):
  `os.path.isdir(model)` wins, else `snapshot_download(model)`; `flow.pt` / `hift.pt` at the snapshot's root
  (`cosyvoice3_code2wav.py` `load_weights`, lines 530-536).

Here, for every family: an existing local folder always wins (as vLLM and all three upstream classes do);
a string that is not a folder and is shaped like a repo id (`name` or `org/name`, huggingface_hub's
rules) is looked up with `huggingface_hub.snapshot_download` at construction (as Step-Audio2's and
CosyVoice3's do), with the revision vLLM gives (`model_config.revision`, as MiniCPM-o's does; None =
the default branch). Online, only the files the stage reads are fetched (`allow_patterns`: the family's
`hub_files` in every layout `resolve_token2wav_dir` accepts, `hub_patterns`); the layouts and the
default-voice places are then those of `families.py`, searched in the snapshot folder.

The hub cache and offline mode are huggingface_hub's own, as it derived them from the environment when
it was imported (`HF_HUB_CACHE`, else `HF_HOME/hub`; `HF_HUB_OFFLINE`): `constants.HF_HUB_CACHE` and
`constants.is_offline_mode()`, read at call time and passed explicitly (`cache_dir`, `local_files_only`),
so the error can name what was searched. These are the values vLLM's own look-ups in the same process
use. A repo that cannot be had is ONE `HubModelNotFoundError` (a FileNotFoundError) naming the id, the
revision, the cache folder and whether HF_HUB_OFFLINE is set, with the hub's reason in one line; no
exception chain.

`huggingface_hub` is imported only for a repo id: local folders need nothing beyond the core install.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

#: Where `resolve_token2wav_dir` and the default-voice lookup read files, relative to the model folder.
HUB_LAYOUTS = ("", "token2wav/", "assets/token2wav/", "assets/")
#: huggingface_hub's repo id shape (`utils/_validators.py`): `name` or `namespace/name`, word characters,
#: `-` and `.`, at most 96 characters per part, no `--` or `..`, not ending in `.git`.
_REPO_ID = re.compile(r"^(?:[\w\-.]+/)?[\w\-.]{1,96}$")


class HubModelNotFoundError(FileNotFoundError):
    """A repo id given as the model is neither a local folder nor to be had from the hub cache or the hub."""


@dataclass(frozen=True)
class ModelSource:
    """Where the stage reads the model's files: `folder`; `repo_id` and `revision` when it is a hub snapshot."""

    given: str
    folder: Path
    repo_id: str | None = None
    revision: str | None = None

    def describe(self) -> str:
        """The model as errors name it: the folder, or the repo id, its revision and the snapshot folder."""
        if self.repo_id is None:
            return str(self.folder)
        return f"{self.repo_id} (revision {self.revision or 'main'}, snapshot {self.folder})"


def looks_like_repo_id(model: str) -> bool:
    """Whether `model` is shaped like a Hugging Face repo id (not whether the repo exists)."""
    if not _REPO_ID.match(model) or "--" in model or ".." in model or model.endswith(".git"):
        return False
    return not any(part in ("", ".", "..") or part[0] in ".-" or part[-1] in ".-" for part in model.split("/"))


def hub_patterns(files: Iterable[str], layouts: Sequence[str] = HUB_LAYOUTS) -> list[str]:
    """`allow_patterns` for `snapshot_download`: each of `files` at each layout (exact names, no wildcards)."""
    out: list[str] = []
    for layout in layouts:
        for name in files:
            pattern = f"{layout}{name}"
            if pattern not in out:
                out.append(pattern)
    return out


def resolve_model_source(
    model: str | os.PathLike[str],
    *,
    revision: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    offline: bool | None = None,
) -> ModelSource:
    """The folder of `model_config.model` (see the module docstring).

    A local folder is returned as given; a string that is neither a folder nor shaped like a repo id is
    returned as given too (the asset lookup then names the missing folder). `cache_dir` / `offline`
    default to huggingface_hub's `HF_HUB_CACHE` / `is_offline_mode()` at call time.
    """
    given = os.fspath(model)
    if Path(given).is_dir() or not looks_like_repo_id(given):
        return ModelSource(given, Path(given))
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        raise HubModelNotFoundError(
            f"model {given!r} is not a local folder, and looking it up as a Hugging Face repo id needs the "
            "huggingface_hub package (installed with vLLM and transformers): pip install huggingface_hub, "
            "or pass the model's local folder"
        ) from None
    from vllm_omni_token2wav.version import __version__

    cache = Path(constants.HF_HUB_CACHE if cache_dir is None else cache_dir).expanduser()
    offline = constants.is_offline_mode() if offline is None else offline
    try:
        snapshot = huggingface_hub.snapshot_download(
            given,
            revision=revision,
            cache_dir=cache,
            local_files_only=offline,
            allow_patterns=None if allow_patterns is None else list(allow_patterns),
            library_name="vllm-omni-token2wav",
            library_version=__version__,
        )
    except Exception as exc:  # every failure of the look-up is the one error below (no chain)
        raise _not_found(given, revision, cache, offline, exc) from None
    logger.info("model %s (revision %s): hub snapshot %s", given, revision or "main", snapshot)
    return ModelSource(given, Path(snapshot), repo_id=given, revision=revision)


def _not_found(repo_id: str, revision: str | None, cache: Path, offline: bool, exc: Exception) -> HubModelNotFoundError:
    reason = " ".join(str(exc).split()) or "no detail"
    where = f"the hub cache {cache} (models--{repo_id.replace('/', '--')}/)"
    if offline:
        how = f"it is not in {where}, and HF_HUB_OFFLINE is set, so nothing was downloaded"
        fix = (
            f"download it where the cache is (`hf download {repo_id}"
            f"{f' --revision {revision}' if revision else ''}` with the same HF_HUB_CACHE / HF_HOME), "
            "unset HF_HUB_OFFLINE, or pass the model's local folder"
        )
    else:
        how = f"the hub could not provide it and {where} has no snapshot of it"
        fix = "check the id, the revision, your network and token (HF_TOKEN), or pass the model's local folder"
    return HubModelNotFoundError(
        f"model {repo_id!r} (revision {revision or 'main'}) is not a local folder, and as a Hugging Face repo id "
        f"{how} ({type(exc).__name__}: {reason[:400]}). To serve it: {fix}"
    )


__all__ = [
    "HUB_LAYOUTS",
    "HubModelNotFoundError",
    "ModelSource",
    "hub_patterns",
    "looks_like_repo_id",
    "resolve_model_source",
]
