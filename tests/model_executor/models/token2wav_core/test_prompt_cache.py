# SPDX-License-Identifier: Apache-2.0
"""Content LRU and prompt-feature data: hits, eviction, single computation, no aliasing, digests."""

from __future__ import annotations

import hashlib
import io
import threading
import time

import numpy as np
import pytest
import soundfile
import torch

from vllm_omni_token2wav.model_executor.models.audio import decode_audio
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_cache import ContentLruCache
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import PromptFeatures, waveform_digest

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _features(seed: int = 0, frames: int = 50) -> PromptFeatures:
    gen = torch.Generator().manual_seed(seed)
    return PromptFeatures(
        speaker_embedding=torch.randn((1, 192), generator=gen),
        prompt_mel=torch.randn((1, frames, 80), generator=gen),
        prompt_mel_len=torch.tensor([frames], dtype=torch.int32),
        digest=f"d{seed}",
        backend="fake",
    )


def _cache(size: int) -> ContentLruCache[PromptFeatures]:
    return ContentLruCache(size, PromptFeatures.clone)


def test_miss_then_hit_computes_once() -> None:
    cache = _cache(4)
    calls: list[int] = []

    def compute() -> PromptFeatures:
        calls.append(1)
        return _features(1)

    first = cache.get_or_compute("a", compute)
    second = cache.get_or_compute("a", compute)
    assert calls == [1]
    torch.testing.assert_close(second.speaker_embedding, _features(1).speaker_embedding, rtol=0, atol=0)
    assert first.digest == second.digest == "d1"
    stats = cache.stats
    assert (stats.hits, stats.misses, stats.size) == (1, 1, 1)


def test_least_recently_used_entry_is_evicted() -> None:
    cache = _cache(2)
    for key in ("a", "b"):
        cache.get_or_compute(key, lambda key=key: _features(ord(key)))
    cache.get_or_compute("a", lambda: pytest.fail("a is cached"))  # a becomes most recent
    cache.get_or_compute("c", lambda: _features(3))  # evicts b
    assert "a" in cache and "c" in cache and "b" not in cache
    assert len(cache) == 2


def test_size_zero_stores_nothing() -> None:
    cache = _cache(0)
    calls: list[int] = []
    for _ in range(3):
        cache.get_or_compute("a", lambda: calls.append(1) or _features())
    assert len(calls) == 3 and len(cache) == 0


@pytest.mark.parametrize("size", [-1, 1.5, True, None])
def test_bad_size_is_rejected(size: object) -> None:
    with pytest.raises(ValueError, match="cache size"):
        ContentLruCache(size, PromptFeatures.clone)  # type: ignore[arg-type]


def test_sixteen_concurrent_misses_compute_once() -> None:
    cache = _cache(4)
    calls: list[int] = []
    barrier = threading.Barrier(16)
    results: list[PromptFeatures] = []
    lock = threading.Lock()

    def compute() -> PromptFeatures:
        calls.append(1)
        time.sleep(0.1)  # every other thread arrives while this one computes
        return _features(7)

    def worker() -> None:
        barrier.wait()
        value = cache.get_or_compute("voice", compute)
        with lock:
            results.append(value)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]
    assert len(results) == 16
    expected = _features(7).speaker_embedding
    for value in results:
        torch.testing.assert_close(value.speaker_embedding, expected, rtol=0, atol=0)
    pointers = {v.speaker_embedding.data_ptr() for v in results}
    assert len(pointers) == 16  # every caller got its own storage


def test_failed_computation_is_shared_not_cached_and_retried() -> None:
    cache = _cache(4)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []
    calls: list[int] = []

    def broken() -> PromptFeatures:
        calls.append(1)
        time.sleep(0.1)
        raise ValueError("prompt.wav: prompt is digital silence")

    def worker() -> None:
        barrier.wait()
        try:
            cache.get_or_compute("k", broken)
        except ValueError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(errors) == 4
    assert all("digital silence" in str(e) for e in errors)
    assert "k" not in cache
    assert cache.get_or_compute("k", lambda: _features(2)).digest == "d2"


def test_returned_features_do_not_alias_the_cache() -> None:
    cache = _cache(4)
    computed = cache.get_or_compute("k", lambda: _features(5))
    computed.speaker_embedding.fill_(0.0)  # the computing caller corrupts its copy
    hit = cache.get_or_compute("k", lambda: pytest.fail("cached"))
    hit.prompt_mel.fill_(0.0)  # and a hitting caller corrupts its copy
    again = cache.get_or_compute("k", lambda: pytest.fail("cached"))
    reference = _features(5)
    torch.testing.assert_close(again.speaker_embedding, reference.speaker_embedding, rtol=0, atol=0)
    torch.testing.assert_close(again.prompt_mel, reference.prompt_mel, rtol=0, atol=0)


# ---- PromptFeatures ----------------------------------------------------------------------------


def test_clone_shares_no_storage_and_keeps_metadata() -> None:
    original = _features(3)
    copy = original.clone()
    for name in ("speaker_embedding", "prompt_mel", "prompt_mel_len"):
        assert getattr(copy, name).data_ptr() != getattr(original, name).data_ptr()
        torch.testing.assert_close(getattr(copy, name), getattr(original, name), rtol=0, atol=0)
    assert (copy.digest, copy.backend) == (original.digest, original.backend)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("speaker_embedding", torch.zeros((1, 64)), "speaker_embedding must be"),
        ("speaker_embedding", torch.zeros((1, 192), dtype=torch.bfloat16), "speaker_embedding must be"),
        ("prompt_mel", torch.zeros((1, 50, 40)), "prompt_mel must be"),
        ("prompt_mel_len", torch.tensor([49], dtype=torch.int32), "must hold the mel length 50"),
        ("prompt_mel_len", torch.tensor([50], dtype=torch.int64), "prompt_mel_len must be"),
    ],
)
def test_features_reject_wrong_shapes(field: str, value: torch.Tensor, match: str) -> None:
    good = _features()
    kwargs = {
        "speaker_embedding": good.speaker_embedding,
        "prompt_mel": good.prompt_mel,
        "prompt_mel_len": good.prompt_mel_len,
        "digest": "d",
        "backend": "fake",
    }
    kwargs[field] = value
    with pytest.raises(ValueError, match=match):
        PromptFeatures(**kwargs)  # type: ignore[arg-type]


# ---- digests -----------------------------------------------------------------------------------


def _pcm16(seconds: float = 0.5, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.round(0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)


def test_digest_is_the_same_for_int16_and_float_forms_of_the_same_audio() -> None:
    pcm = _pcm16()
    as_float32 = pcm.astype(np.float32) / 32768.0
    as_float64 = pcm.astype(np.float64) / 32768.0
    digests = {
        waveform_digest(pcm, 16000),
        waveform_digest(as_float32, 16000),
        waveform_digest(as_float64, 16000),
        waveform_digest(torch.from_numpy(as_float32), 16000),
    }
    assert len(digests) == 1
    # independent reference: sha256 over "rate:" and the little-endian float32 samples
    expected = hashlib.sha256(b"16000:" + as_float32.astype("<f4").tobytes()).hexdigest()
    assert digests == {expected}


def test_digest_matches_the_front_end_for_arrays_and_files() -> None:
    pcm = _pcm16()
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, 16000, format="WAV", subtype="PCM_16")
    from_file = decode_audio(buffer.getvalue()).digest()
    assert waveform_digest(pcm, 16000) == from_file == decode_audio((pcm, 16000)).digest()


def test_digest_depends_on_rate_and_content() -> None:
    pcm = _pcm16()
    changed = pcm.copy()
    changed[100] += 1
    assert len({waveform_digest(pcm, 16000), waveform_digest(pcm, 24000), waveform_digest(changed, 16000)}) == 3


def test_digest_rejects_non_audio() -> None:
    with pytest.raises(ValueError, match="dtype bool"):
        waveform_digest(np.zeros(10, dtype=bool), 16000)
    with pytest.raises(ValueError, match="mono"):
        waveform_digest(np.zeros((2, 10), dtype=np.float32), 16000)
