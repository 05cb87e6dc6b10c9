# SPDX-License-Identifier: Apache-2.0
"""The toy CosyVoice3 pipeline without an engine: its folder, its deployment overlay, and where its door acts.

- The folder holds what upstream's talker and our code2wav read, and upstream's own readers accept it
  (transformers' `Qwen2Config` / `AutoTokenizer`, upstream's CosyVoice3 tokenizer wrapper).
- The deployment resolved by upstream's own loader (`resolve_deploy_yaml`) is upstream's YAML with only the
  keys the toy names changed.
- The s3tokenizer door acts only in a process that starts with the toy's site folder on `PYTHONPATH` (or
  calls `install()`): a plain process, with the plugin loaded, keeps s3tokenizer's own `load_model`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.engine import require_engine
from vllm_omni_token2wav.model_executor.models.standin.toy import cosyvoice3_door, site_pythonpath, upstream_deploy_yaml
from vllm_omni_token2wav.model_executor.models.standin.toy.cosyvoice3 import (
    PIPELINE,
    SPECIAL_TOKENS,
    TALKER_CONFIG,
    TALKER_SUBDIR,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

REPO = Path(__file__).resolve().parents[5]


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return PIPELINE.ensure_model_dir(tmp_path_factory.mktemp("toy_cv3"))


def test_pipeline_names_its_family_and_upstreams_yaml() -> None:
    assert PIPELINE.family == "cosyvoice3"
    assert PIPELINE.yaml_name(async_chunk=True) == PIPELINE.yaml_name(async_chunk=False) == "cosyvoice3.yaml"


def test_folder_holds_what_upstreams_talker_and_our_code2wav_read(toy_dir: Path) -> None:
    from transformers import AutoTokenizer, Qwen2Config

    assert json.loads((toy_dir / "config.json").read_text()) == {}  # vLLM-Omni patches in CosyVoice3Config
    for name in ("flow.pt", "hift.pt", "campplus.onnx", "default_voice.wav", "default_voice.tokens"):
        assert (toy_dir / name).is_file(), name
    config = Qwen2Config.from_pretrained(toy_dir / TALKER_SUBDIR)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (896, 1, TALKER_CONFIG["vocab_size"])
    tokenizer = AutoTokenizer.from_pretrained(toy_dir / TALKER_SUBDIR)
    assert len(tokenizer) == TALKER_CONFIG["vocab_size"]
    for token, token_id in SPECIAL_TOKENS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
    assert all(tokenizer.decode([i]) for i in range(len(tokenizer)))  # every id decodes to something
    text = "Hello, world<|endofprompt|>"
    ids = tokenizer(text)["input_ids"]
    assert max(ids) < TALKER_CONFIG["vocab_size"] and tokenizer.decode(ids) == text


def test_folder_is_deterministic(toy_dir: Path, tmp_path: Path) -> None:
    again = PIPELINE.ensure_model_dir(tmp_path / "again")
    for rel in ("config.json", f"{TALKER_SUBDIR}/config.json", f"{TALKER_SUBDIR}/tokenizer.json"):
        assert (again / rel).read_bytes() == (toy_dir / rel).read_bytes(), rel


def test_upstreams_tokenizer_wrapper_keeps_the_toy_texts_in_the_talkers_vocabulary(toy_dir: Path) -> None:
    require_engine("upstream's CosyVoice3 tokenizer wrapper")
    from vllm_omni.model_executor.models.cosyvoice3.tokenizer import CosyVoice3Tokenizer

    wrapper = CosyVoice3Tokenizer(str(toy_dir / TALKER_SUBDIR))
    ids = wrapper.encode("Request cv3-a says hello.<|endofprompt|>")
    assert ids[-1] == SPECIAL_TOKENS["<|endofprompt|>"] and max(ids) < TALKER_CONFIG["vocab_size"]


@pytest.mark.parametrize("async_chunk", [True, False])
def test_deployment_is_upstreams_yaml_with_only_the_toy_keys_changed(
    toy_dir: Path, tmp_path: Path, async_chunk: bool
) -> None:
    require_engine("upstream's deploy YAML loader")
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    path = PIPELINE.deployment(toy_dir, tmp_path, async_chunk=async_chunk, stage_overrides={1: {"max_num_seqs": 4}})
    shipped = upstream_deploy_yaml("cosyvoice3.yaml")
    assert yaml.safe_load(path.read_text())["base_config"] == str(shipped)
    upstream = resolve_deploy_yaml(shipped)
    merged = resolve_deploy_yaml(path)
    cpu_keys = {"enforce_eager": True, "devices": "0", "tensor_parallel_size": 1}
    changed: dict[int, dict[str, Any]] = {
        0: {**cpu_keys, "load_format": "dummy"},
        1: {**cpu_keys, "additional_config": {"token2wav_n_timesteps": 2}, "max_num_seqs": 4},
    }
    for base, stage in zip(upstream["stages"], merged["stages"], strict=True):
        sid = stage["stage_id"]
        kept = {k: v for k, v in stage.items() if k not in changed[sid]}
        assert kept == {k: v for k, v in base.items() if k not in changed[sid]} and kept, sid
        assert {k: stage[k] for k in changed[sid]} == changed[sid]
    assert merged["async_chunk"] is async_chunk and merged["connectors"] == upstream["connectors"]
    assert merged["pipeline"] == upstream["pipeline"] == "cosyvoice3"
    cpu = merged["platforms"]["cpu"]["stages"]
    assert [s["stage_id"] for s in cpu] == [0, 1] and all(s["kv_cache_memory_bytes"] > 0 for s in cpu)
    with pytest.raises(FileNotFoundError, match="not a toy CosyVoice3 folder"):
        PIPELINE.deployment(tmp_path, tmp_path, async_chunk=async_chunk)


def test_request_formats_are_upstreams(toy_dir: Path) -> None:
    require_engine("vLLM's SamplingParams")
    prompt, params = PIPELINE.offline_prompt("Hi there", codes=12)
    assert prompt["prompt"] == "Hi there" and prompt["mm_processor_kwargs"]["prompt_text"]
    audio, rate = prompt["multi_modal_data"]["audio"]
    assert rate == 24000 and audio.ndim == 1 and audio.size > rate
    assert (params[0].min_tokens, params[0].max_tokens) == (12, 12) and len(params) == 2
    path, body = PIPELINE.http_request("Hi there", stream=False)
    assert path == "/v1/audio/speech" and body["response_format"] == "wav" and "stream" not in body
    assert body["ref_audio"].startswith("data:audio/wav;base64,") and body["ref_text"]
    _, streamed = PIPELINE.http_request("Hi there", stream=True)
    assert streamed["stream"] is True and streamed["stream_format"] == "audio" and streamed["response_format"] == "pcm"


_PROBE = """
import json, sys
from vllm_omni_token2wav.plugins import load_plugins
load_plugins()
import s3tokenizer
marked = bool(getattr(s3tokenizer.load_model, "_vllm_omni_token2wav_toy_door", False))
door = "vllm_omni_token2wav.model_executor.models.standin.toy.cosyvoice3_door"
out = {"marked": marked, "door_imported": door in sys.modules}
if marked:
    import torch
    model = s3tokenizer.load_model("speech_tokenizer_v3_25hz")
    mel = s3tokenizer.log_mel_spectrogram(torch.sin(torch.arange(32000) * 0.05))
    mels, lens = s3tokenizer.padding([mel])
    codes, n = model.quantize(mels, lens)
    out["codes"] = codes[0, : int(n[0])].tolist()
print(json.dumps(out))
"""


def _probe(pythonpath: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != cosyvoice3_door.RECORD_ENV}
    env.update(PYTHONPATH=pythonpath, XDG_CACHE_HOME="/nonexistent-toy-door-test")  # a download would fail
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_s3tokenizer_door_acts_only_where_the_toy_puts_it() -> None:
    require_engine("the s3tokenizer door", extra=("s3tokenizer",))
    plain = _probe(str(REPO))
    assert plain == {"marked": False, "door_imported": False}  # a deployment with the plugin: s3tokenizer's own
    toy = _probe(site_pythonpath(str(REPO)))
    assert toy["marked"] and toy["door_imported"]
    assert len(toy["codes"]) == 50 and all(0 <= c < 6561 for c in toy["codes"])  # 2 s at 25 Hz
    import s3tokenizer  # in this process: the stand-in built directly gives the same ids (seeded, no state)
    import torch

    mel = s3tokenizer.log_mel_spectrogram(torch.sin(torch.arange(32000) * 0.05))
    mels, lens = s3tokenizer.padding([mel])
    codes, n = cosyvoice3_door.standin_s3tokenizer_v3().quantize(mels, lens)
    assert codes[0, : int(n[0])].tolist() == toy["codes"]


def test_install_and_uninstall_in_process() -> None:
    require_engine("the s3tokenizer door", extra=("s3tokenizer",))
    import s3tokenizer

    original = s3tokenizer.load_model
    assert not getattr(original, "_vllm_omni_token2wav_toy_door", False)
    cosyvoice3_door.install()
    try:
        assert s3tokenizer.load_model is not original and s3tokenizer.load_model.__wrapped__ is original
    finally:
        cosyvoice3_door.uninstall()
    assert s3tokenizer.load_model is original


def test_only_the_toy_imports_the_door() -> None:
    """No plugin module imports the door: it is reached only from the toy's own modules and its site folder."""
    package = REPO / "vllm_omni_token2wav"
    toy = package / "model_executor" / "models" / "standin" / "toy"
    importers = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and "cosyvoice3_door" in node.module:
                importers.append(path)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("standin.toy"):
                if any(a.name == "cosyvoice3_door" for a in node.names):
                    importers.append(path)
    assert importers and all(toy in p.parents for p in importers), importers


def test_a_second_engine_records_into_its_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two toy engines alive at once (module-scoped fixtures): each records into the folder set when it started.
    An engine resolves the producer function once, at its start; a later `install()` wraps the original again."""
    import types

    producer = types.ModuleType(cosyvoice3_door.PRODUCER_MODULE)

    def text2flow_full_payload(transfer_manager: Any, output: Any, request: Any) -> dict[str, int]:
        return {"n": output}

    producer.text2flow_full_payload = text2flow_full_payload  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, cosyvoice3_door.PRODUCER_MODULE, producer)
    first, second = tmp_path / "first", tmp_path / "second"
    try:
        monkeypatch.setenv(cosyvoice3_door.RECORD_ENV, str(first))
        cosyvoice3_door.install()
        held_by_first_engine = producer.text2flow_full_payload  # type: ignore[attr-defined]
        monkeypatch.setenv(cosyvoice3_door.RECORD_ENV, str(second))
        cosyvoice3_door.install()
        producer.text2flow_full_payload(None, 2, None)  # type: ignore[attr-defined]
        held_by_first_engine(None, 1, None)
    finally:
        cosyvoice3_door.uninstall()
    import torch

    def results(folder: Path) -> list[Any]:
        return [torch.load(p, weights_only=False)["result"] for p in sorted(folder.glob("*.pt"))]

    assert results(first) == [{"n": 1}] and results(second) == [{"n": 2}]
    assert producer.text2flow_full_payload is text2flow_full_payload  # type: ignore[attr-defined]
