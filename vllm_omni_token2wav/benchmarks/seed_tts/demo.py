# SPDX-License-Identifier: Apache-2.0
"""The bundled English demo set and an espeak-ng "system" that voices it, for an offline end-to-end run.

The public Seed-TTS sets cannot be shipped (and cannot be downloaded on build machines), yet the WER gate
must be runnable anywhere. `demo_en.lst` holds 24 sentences written by the team for this purpose;
`materialize_demo` writes a Seed-TTS style folder (meta.lst, prompt wavs, "generated" wavs) where Debian's
`espeak-ng` plays the TTS system under test. Its WER under the default ASR (faster-whisper tiny.en) is the
documented baseline in docs/benchmarks/seed_tts.md: a robotic rule-based synthesiser read by the smallest
Whisper, so a real TTS system is expected to score well below it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from vllm_omni_token2wav.benchmarks.progress import progress as progress_bar
from vllm_omni_token2wav.benchmarks.seed_tts.dataset import load_seed_tts_meta
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

DEMO_META_RESOURCE = "demo_en.lst"
ESPEAK = "espeak-ng"
# Two voices so the prompt speaker differs from the "generated" one, as in a real voice-cloning set.
PROMPT_VOICE = "en-us+f3"
TARGET_VOICE = "en-us"


def demo_meta_path() -> Path:
    """Path of the bundled English demo meta file (package data)."""
    ref = resources.files("vllm_omni_token2wav.benchmarks.seed_tts").joinpath(DEMO_META_RESOURCE)
    path = Path(str(ref))
    if not path.is_file():
        raise FileNotFoundError(f"bundled demo set missing: {path}; reinstall vllm-omni-token2wav (package data)")
    return path


def espeak_available() -> bool:
    return shutil.which(ESPEAK) is not None


def synthesize_espeak(text: str, out_wav: Path, voice: str = TARGET_VOICE, words_per_minute: int = 165) -> None:
    """Voice `text` into `out_wav` (22.05 kHz mono PCM16) with espeak-ng."""
    exe = shutil.which(ESPEAK)
    if exe is None:
        raise FileNotFoundError(
            f"{ESPEAK} not found on PATH; the Seed-TTS demo uses it as the baseline TTS system: "
            f"apt-get install -y espeak-ng"
        )
    out_wav.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_wav.with_name(f".{out_wav.name}.tmp.wav")
    proc = subprocess.run(
        [exe, "-v", voice, "-s", str(words_per_minute), "-w", str(tmp), "--", text],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size <= 44:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{ESPEAK} failed (exit {proc.returncode}) for voice {voice}: {proc.stderr.strip()}")
    tmp.replace(out_wav)


@dataclass(frozen=True)
class DemoSet:
    meta_path: Path
    gen_dir: Path
    num_items: int


def materialize_demo(
    work_dir: str | Path, *, subset: int | None = None, with_prompts: bool = True, progress: bool = False
) -> DemoSet:
    """Write `work_dir/meta.lst` (the first `subset` demo lines), prompt wavs and espeak "generated" wavs.

    Prompt wavs are only needed to drive a server (`serve` mode); scoring reads `generated/<utt>.wav`.
    `progress` reports the voicing step (`benchmarks.progress`: a bar on a terminal, lines otherwise).
    """
    root = Path(work_dir)
    root.mkdir(parents=True, exist_ok=True)
    source = load_seed_tts_meta(demo_meta_path(), "en", subset=subset)
    meta_lines = [f"{it.utt}|{it.prompt_text}|prompt-wavs/{it.utt}.wav|{it.target_text}" for it in source.items]
    meta_path = root / "meta.lst"
    meta_path.write_text("\n".join(meta_lines) + "\n", encoding="utf-8")
    gen_dir = root / "generated"
    with progress_bar(len(source.items), f"voicing with {ESPEAK}", "utt", enabled=progress) as bar:
        for it in source.items:
            if with_prompts:
                synthesize_espeak(it.prompt_text, root / "prompt-wavs" / f"{it.utt}.wav", voice=PROMPT_VOICE)
            synthesize_espeak(it.target_text, gen_dir / f"{it.utt}.wav", voice=TARGET_VOICE)
            bar.update()
    logger.info("demo set: %d utterances voiced by %s under %s", len(source.items), ESPEAK, root)
    return DemoSet(meta_path=meta_path, gen_dir=gen_dir, num_items=len(source.items))
