#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The table behind the prompt activity rule: how much sustained signal clicks, beeps and real speech carry.

Why: `load_prompt_audio` refuses prompts with less than `MIN_ACTIVE_SECONDS` of active frames
(25 ms frames whose RMS is within `ACTIVE_WITHIN_DB` of the loudest frame and at least
`ACTIVE_FLOOR_DBFS`). The limits are only as good as the numbers that place them between what
must be refused (a click in silence, a few clicks, short beeps) and what must pass (real speech,
also much quieter than recorded, and the short speech windows the tests use as voices). This prints
those numbers for the shipped CMU ARCTIC clip and synthetic transients, and whether each passes,
for docs/design/audio_frontend.md ("Prompt activity"). Deterministic; no timing.

    .venv/bin/python benchmarks/prompt_activity.py

Writes benchmarks/results/prompt_activity.txt (atomically).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from vllm_omni_token2wav.assets.audio import speech_sample  # noqa: E402
from vllm_omni_token2wav.atomic_io import atomic_output  # noqa: E402
from vllm_omni_token2wav.model_executor.models.audio.loading import (  # noqa: E402
    ACTIVE_FLOOR_DBFS,
    ACTIVE_WITHIN_DB,
    MIN_ACTIVE_SECONDS,
    MIN_PROMPT_PEAK_DBFS,
    peak_dbfs_after_dc_removal,
    prompt_activity,
)

RATE = 16_000
#: 16-bit TPDF dither: 0.5 LSB RMS (2^-16), -96.3 dBFS.
DITHER_RMS = 2.0**-16


def _beeps(lengths_ms: list[int], seconds: float = 1.0, gap_s: float = 0.3) -> np.ndarray:
    """1 kHz beeps at 0.5 amplitude, `gap_s` apart, in `seconds` of zeros."""
    x = np.zeros(int(seconds * RATE), dtype=np.float64)
    start = int(0.1 * RATE)
    for ms in lengths_ms:
        n = int(ms * RATE / 1000)
        x[start : start + n] = 0.5 * np.sin(2 * np.pi * 1000 * np.arange(n) / RATE)
        start += n + int(gap_s * RATE)
    return x


def _clicks(positions_s: list[float], amplitude: float = 0.5, seconds: float = 1.0) -> np.ndarray:
    x = np.zeros(int(seconds * RATE), dtype=np.float64)
    x[[int(p * RATE) for p in positions_s]] = amplitude
    return x


def cases() -> Iterator[tuple[str, np.ndarray]]:
    """(name, 16 kHz float waveform) of every row of the table."""
    dither = np.random.default_rng(0).triangular(-1.0, 0.0, 1.0, RATE) * DITHER_RMS * np.sqrt(6.0)
    yield "one click (0.5) in 1 s of zeros", _clicks([0.5])
    yield "one click (0.5) on 16-bit dither", _clicks([0.5]) + dither
    yield "one click (-50 dBFS) on 16-bit dither", _clicks([0.5], amplitude=10 ** (-50 / 20)) + dither
    yield "five clicks in 1 s", _clicks([0.1, 0.3, 0.5, 0.7, 0.9])
    yield "beep 100 ms", _beeps([100])
    yield "beep 250 ms", _beeps([250])
    yield "three beeps of 60 ms", _beeps([60, 60, 60])
    yield "two beeps of 100 ms", _beeps([100, 100])
    yield "beep 300 ms", _beeps([300])
    speech, rate = speech_sample()
    assert rate == RATE
    wav = speech.astype(np.float64)
    for attenuation in (0, 20, 30, 40, 50):
        yield f"shipped clip {-attenuation:+d} dB", wav * 10 ** (-attenuation / 20)
    # The quietest the level rule admits: peak at the -60 dBFS floor.
    at_floor = wav * 10 ** (MIN_PROMPT_PEAK_DBFS / 20) / np.abs(wav - wav.mean()).max()
    yield "shipped clip, peak at -60 dBFS", at_floor
    windows = [wav[i * 800 : i * 800 + 8000] for i in range(16)]  # the 0.5 s voices of the facade tests
    shortest = min(windows, key=lambda w: prompt_activity(w, RATE).active_frames)
    yield "shortest 0.5 s window the tests use", shortest
    yield "first 1.0 s of the clip", wav[:RATE]


def report() -> str:
    lines = [
        f"active: 25 ms frames every 10 ms within {ACTIVE_WITHIN_DB:g} dB of the loudest frame and >= "
        f"{ACTIVE_FLOOR_DBFS:g} dBFS RMS; a prompt needs {MIN_ACTIVE_SECONDS:g} s",
        f"{'signal':42s} {'seconds':>7s} {'peak dBFS':>9s} {'loudest':>8s} {'active s':>8s}  result",
    ]
    for name, wav in cases():
        activity = prompt_activity(wav.astype(np.float32), RATE)
        peak = peak_dbfs_after_dc_removal(wav.astype(np.float32))
        verdict = "accepted" if activity.active_seconds >= MIN_ACTIVE_SECONDS else "refused"
        lines.append(
            f"{name:42s} {wav.shape[0] / RATE:7.2f} {peak:9.1f} {activity.loudest_dbfs:8.1f} "
            f"{activity.active_seconds:8.2f}  {verdict}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "prompt_activity.txt")
    args = parser.parse_args(argv)
    text = report()
    print(text, end="")
    with atomic_output(args.out) as tmp:
        Path(tmp).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
