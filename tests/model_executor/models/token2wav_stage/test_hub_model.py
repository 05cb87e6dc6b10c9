# SPDX-License-Identifier: Apache-2.0
"""A Hugging Face repo id as `model_config.model`: each family's stage class built from an offline hub cache.

`vllm-omni serve openbmb/MiniCPM-o-4_5 --omni` hands the stage the repo id, not a folder
(`token2wav_stage/model_source.py`). The cache here is laid out as huggingface_hub lays it out
(`tests/helpers/hub_cache.py`: `models--org--name/refs/main` + `snapshots/<hash>/`), holding the
project's engine stand-in folders (`standin/model_dirs.py`). No test touches the network: the cache is
searched offline, and the one online case talks to a closed local port.

huggingface_hub derives its cache folder and offline flag from the environment when it is imported;
the stage reads them from `huggingface_hub.constants` at construction. In this process (where vLLM or
transformers may have imported huggingface_hub already) the tests set those two constants
(`hub_env`); `test_the_environment_alone_drives_the_lookup_in_a_fresh_process` shows that
`HF_HUB_OFFLINE` / `HF_HUB_CACHE` set before the import are what a fresh process uses.

Each family's hub-built stage must serve exactly the audio of the same stage built from the local
folder (same files, same seeds): the snapshot is the model, not something else that happens to load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.engine import in_ci
from tests.helpers.hub_cache import add_snapshot, commit_hash, folder_files, repo_folder
from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks, forward_inputs
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.model_source import (
    HubModelNotFoundError,
    hub_patterns,
    looks_like_repo_id,
    resolve_model_source,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

try:
    import huggingface_hub.constants as hub_constants
except ImportError:  # the core install: local folders only (test_local_folders_need_no_huggingface_hub)
    if in_ci():
        raise
    pytest.skip("huggingface_hub is not installed (it comes with vLLM / transformers)", allow_module_level=True)

REPO_ROOT = Path(__file__).resolve().parents[4]
STAGES: dict[str, type[Token2WavStageModel]] = {
    "minicpmo_4_5": MiniCPMO45Code2Wav,
    "step_audio2": StepAudio2Token2WavForConditionalGeneration,
    "cosyvoice3": CosyVoice3Code2Wav,
}
#: The ids users serve (README), one per family.
REPO_IDS = {
    "minicpmo_4_5": "openbmb/MiniCPM-o-4_5",
    "step_audio2": "stepfun-ai/Step-Audio-2-mini",
    "cosyvoice3": "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
}
#: Where each family's stand-in engine folder keeps its token2wav assets (`model_dirs._ASSET_SUBDIR`).
NATIVE_LAYOUT = {"minicpmo_4_5": "assets/token2wav/", "step_audio2": "token2wav/", "cosyvoice3": ""}


def _engine_dir(family: str) -> Path:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    return ensure_engine_model_dir(family)


def _config(model: str | Path, revision: str | None = None) -> SimpleNamespace:
    """A duck-typed VllmConfig as the runner hands it (`options.py` lists what the stage reads)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(model),
            revision=revision,
            hf_config=SimpleNamespace(),
            stage_connector_config={"extra": {"token2wav_n_timesteps": 2, "ref_audio_max_seconds": 1.5}},
        ),
        device_config=SimpleNamespace(device=torch.device("cpu")),
        scheduler_config=SimpleNamespace(max_num_seqs=4),
        load_config=SimpleNamespace(load_format="dummy"),
    )


def _one_step(stage: Token2WavStageModel, tokens: int = 40) -> torch.Tensor:
    """The audio of one request's first chunk (CosyVoice3: with the default voice's prompt tokens)."""
    prompt = getattr(stage.default_voice, "tokens", None)
    extra = {} if prompt is None else {"prompt_tokens": prompt.shape[1]}
    chunks = all_chunks(ProducerStream("hub", list(range(10, 10 + tokens)), stage.family, **extra))
    input_ids, kwargs = forward_inputs(chunks[:1], stage.family)
    out = stage(input_ids, None, **kwargs).multimodal_outputs
    assert segment_errors(out) == [None]
    audio = out[stage.family.output_key][0]
    assert audio.dtype == torch.float32 and audio.numel() > 0 and audio.abs().max() > 0
    return audio


@dataclass
class HubEnv:
    cache: Path

    def snapshot(self, repo_id: str, revision: str) -> Path:
        return repo_folder(self.cache, repo_id) / "snapshots" / revision


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEnv]:
    """An empty hub cache, offline: huggingface_hub's constants as `HF_HUB_CACHE` / `HF_HUB_OFFLINE=1` make them."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    yield HubEnv(cache)


@pytest.fixture(scope="module")
def local_audio() -> dict[str, torch.Tensor]:
    """Each family's first-chunk audio from its stage built on the local stand-in folder (the reference).

    Under one intra-op thread, as every test of this folder runs (module fixtures start before the autouse one).
    """
    with one_intra_op_thread():
        return {family: _one_step(cls(vllm_config=_config(_engine_dir(family)))) for family, cls in STAGES.items()}


def test_repo_ids_and_paths_are_told_apart() -> None:
    for repo_id in (*REPO_IDS.values(), "gpt2", "org/name.v2", "a-b_c/d.e-f"):
        assert looks_like_repo_id(repo_id), repo_id
    for path in ("/abs/model", "./model", "../model", "~/model", "a/b/c", "org/", "/", "", "org--x/y", "x/y.git"):
        assert not looks_like_repo_id(path), path
    assert hub_patterns(("flow.pt", "hift.pt"), ("", "token2wav/")) == [
        "flow.pt",
        "hift.pt",
        "token2wav/flow.pt",
        "token2wav/hift.pt",
    ]


@pytest.mark.parametrize("family", list(STAGES))
def test_each_family_builds_from_a_hub_id_and_serves_the_local_folders_audio(
    family: str, hub_env: HubEnv, local_audio: dict[str, torch.Tensor]
) -> None:
    repo_id, rev = REPO_IDS[family], commit_hash(family)
    snapshot = add_snapshot(hub_env.cache, repo_id, folder_files(_engine_dir(family)), revision=rev)
    stage = STAGES[family](vllm_config=_config(repo_id))
    assert stage.options.model == repo_id and stage.model_source is not None
    assert (stage.model_source.folder, stage.model_source.repo_id) == (snapshot, repo_id)
    assert stage.token2wav.model_path == snapshot / NATIVE_LAYOUT[family]
    voice = getattr(stage.default_voice, "audio", stage.default_voice)  # CosyVoice3: a ReferenceVoice
    assert Path(voice).is_relative_to(snapshot), voice
    audio = _one_step(stage)
    assert torch.equal(audio, local_audio[family])


@pytest.mark.parametrize(
    ("layout", "blobs"),
    [("", False), ("token2wav/", False), ("assets/token2wav/", False), ("assets/token2wav/", True)],
    ids=["root", "token2wav", "assets-token2wav", "assets-token2wav-blobs"],
)
def test_the_assets_are_found_in_every_layout_of_the_snapshot(
    layout: str, blobs: bool, hub_env: HubEnv, local_audio: dict[str, torch.Tensor]
) -> None:
    repo_id, rev = "stepfun-ai/Step-Audio-2-mini", commit_hash(layout + str(blobs))
    files = folder_files(_engine_dir("step_audio2"), move={"token2wav/": layout}, skip=("standin_producer/",))
    snapshot = add_snapshot(hub_env.cache, repo_id, files, revision=rev, blobs=blobs)
    assert (snapshot / layout / "flow.pt").is_symlink() is blobs
    stage = StepAudio2Token2WavForConditionalGeneration(vllm_config=_config(repo_id))
    assert stage.token2wav.model_path == snapshot / layout.rstrip("/") if layout else snapshot
    assert stage.default_voice == snapshot / layout / "default_female.wav"
    assert torch.equal(_one_step(stage), local_audio["step_audio2"])


def test_the_revision_vllm_gives_picks_the_snapshot(hub_env: HubEnv) -> None:
    repo_id = "openbmb/MiniCPM-o-4_5"
    source = folder_files(_engine_dir("minicpmo_4_5"), skip=("standin_producer/",))
    main, v2 = commit_hash("main"), commit_hash("v2")
    add_snapshot(hub_env.cache, repo_id, source, revision=main, refs=("main",))
    # The second commit moves the default voice: which snapshot the stage read shows in its default voice.
    moved = {
        ("assets/token2wav/HT_ref_audio.wav" if k == "assets/HT_ref_audio.wav" else k): v for k, v in source.items()
    }
    add_snapshot(hub_env.cache, repo_id, moved, revision=v2, refs=("v2",))
    for revision, commit, voice in (
        (None, main, "assets/HT_ref_audio.wav"),
        ("main", main, "assets/HT_ref_audio.wav"),
        ("v2", v2, "assets/token2wav/HT_ref_audio.wav"),
        (v2, v2, "assets/token2wav/HT_ref_audio.wav"),  # a commit hash
    ):
        stage = MiniCPMO45Code2Wav(vllm_config=_config(repo_id, revision))
        snapshot = hub_env.snapshot(repo_id, commit)
        assert stage.options.revision == revision and stage.model_source.folder == snapshot  # type: ignore[union-attr]
        assert stage.token2wav.model_path == snapshot / "assets" / "token2wav"
        assert stage.default_voice == snapshot / voice, revision
    with pytest.raises(HubModelNotFoundError, match=r"'openbmb/MiniCPM-o-4_5' \(revision v3\)") as info:
        MiniCPMO45Code2Wav(vllm_config=_config(repo_id, "v3"))
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_repo_missing_offline_is_one_error_naming_id_revision_cache_and_offline(hub_env: HubEnv) -> None:
    with pytest.raises(HubModelNotFoundError) as info:
        StepAudio2Token2WavForConditionalGeneration(vllm_config=_config("stepfun-ai/Step-Audio-2-mini", "v1.1"))
    message = str(info.value)
    assert message.startswith(
        "model 'stepfun-ai/Step-Audio-2-mini' (revision v1.1) is not a local folder, and as a Hugging Face repo id it "
        f"is not in the hub cache {hub_env.cache} (models--stepfun-ai--Step-Audio-2-mini/), and HF_HUB_OFFLINE is set, "
        "so nothing was downloaded (LocalEntryNotFoundError: "
    ), message
    assert "`hf download stepfun-ai/Step-Audio-2-mini --revision v1.1`" in message and "\n" not in message
    assert isinstance(info.value, FileNotFoundError) and info.value.__cause__ is None
    assert info.value.__suppress_context__  # one error, no chain of tracebacks


def test_a_repo_the_hub_cannot_provide_online_is_the_same_one_error(
    hub_env: HubEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")  # a closed local port: no network
    with pytest.raises(HubModelNotFoundError) as info:
        CosyVoice3Code2Wav(vllm_config=_config("FunAudioLLM/Fun-CosyVoice3-0.5B-2512"))
    message = str(info.value)
    assert "'FunAudioLLM/Fun-CosyVoice3-0.5B-2512' (revision main)" in message and str(hub_env.cache) in message
    assert "the hub could not provide it" in message and "HF_HUB_OFFLINE" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_snapshot_without_token2wav_assets_names_the_repo(hub_env: HubEnv) -> None:
    repo_id, rev = "openbmb/MiniCPM-o-4_5", commit_hash("config only")
    add_snapshot(hub_env.cache, repo_id, {"config.json": _engine_dir("minicpmo_4_5") / "config.json"}, revision=rev)
    with pytest.raises(FileNotFoundError) as info:
        MiniCPMO45Code2Wav(vllm_config=_config(repo_id))
    snapshot = hub_env.snapshot(repo_id, rev)
    assert str(info.value).startswith(
        f"no token2wav assets for model {repo_id} (revision main, snapshot {snapshot}): looked for flow.yaml"
    )


def test_a_local_folder_wins_over_the_cache(hub_env: HubEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_id = "stepfun-ai/Step-Audio-2-mini"
    add_snapshot(hub_env.cache, repo_id, folder_files(_engine_dir("step_audio2")), revision=commit_hash("cached"))
    monkeypatch.chdir(tmp_path)
    local = tmp_path / repo_id
    (local / "token2wav").mkdir(parents=True)
    for rel, path in folder_files(_engine_dir("step_audio2") / "token2wav").items():
        (local / "token2wav" / rel).symlink_to(path)
    stage = StepAudio2Token2WavForConditionalGeneration(vllm_config=_config(repo_id))
    assert stage.model_source.repo_id is None and stage.token2wav.model_path == Path(repo_id) / "token2wav"  # type: ignore[union-attr]


def test_local_folders_need_no_huggingface_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` raises ImportError
    folder = _engine_dir("step_audio2")
    stage = StepAudio2Token2WavForConditionalGeneration(vllm_config=_config(folder))
    assert stage.token2wav.model_path == folder / "token2wav"
    with pytest.raises(HubModelNotFoundError, match=r"'org/name' is not a local folder.*needs the huggingface_hub"):
        resolve_model_source("org/name")


def test_the_environment_alone_drives_the_lookup_in_a_fresh_process(tmp_path: Path) -> None:
    """HF_HUB_OFFLINE / HF_HUB_CACHE set before anything imports huggingface_hub: no constants touched."""
    cache = tmp_path / "hub"
    repo_id, rev = REPO_IDS["step_audio2"], commit_hash("env")
    snapshot = add_snapshot(cache, repo_id, folder_files(_engine_dir("step_audio2")), revision=rev)
    script = textwrap.dedent(
        f"""
        import json, sys
        from vllm_omni_token2wav import platforms
        from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform
        from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
            StepAudio2Token2WavForConditionalGeneration as Stage,
        )
        from vllm_omni_token2wav.model_executor.models.token2wav_stage.model_source import HubModelNotFoundError

        assert "huggingface_hub" not in sys.modules  # the environment is all it will read
        from tests.model_executor.models.token2wav_stage.test_hub_model import _config, _one_step

        platforms.reset_current_platform(CpuDevicePlatform())
        stage = Stage(vllm_config=_config({repo_id!r}))
        out = {{"folder": str(stage.token2wav.model_path), "samples": _one_step(stage).numel()}}
        try:
            Stage(vllm_config=_config("stepfun-ai/missing"))
        except HubModelNotFoundError as exc:
            out["error"] = str(exc)
        print(json.dumps(out))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf_home")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["folder"] == str(snapshot / "token2wav") and out["samples"] > 0
    assert f"the hub cache {cache} (models--stepfun-ai--missing/)" in out["error"]
    assert "HF_HUB_OFFLINE is set" in out["error"]
