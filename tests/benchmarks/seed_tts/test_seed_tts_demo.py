# SPDX-License-Identifier: Apache-2.0
"""The demo set's voicing step reports progress (espeak-ng replaced by a recorder: no binary needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni_token2wav.benchmarks.seed_tts import demo as seed_tts_demo

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_voicing_the_demo_reports_progress_in_plain_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    voiced: list[tuple[str, str]] = []

    def fake_espeak(text: str, out_wav: Path, voice: str = seed_tts_demo.TARGET_VOICE, **_: object) -> None:
        out_wav.parent.mkdir(parents=True, exist_ok=True)
        out_wav.write_bytes(b"RIFF")
        voiced.append((out_wav.name, voice))

    monkeypatch.setattr(seed_tts_demo, "synthesize_espeak", fake_espeak)
    demo = seed_tts_demo.materialize_demo(tmp_path, subset=3, with_prompts=True, progress=True)
    assert demo.num_items == 3 and len(voiced) == 6
    err = capsys.readouterr().err
    assert "\r" not in err and "voicing with espeak-ng: 3/3 utt (100 %" in err
