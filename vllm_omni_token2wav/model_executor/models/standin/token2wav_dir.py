# SPDX-License-Identifier: Apache-2.0
"""A complete deterministic stand-in token2wav directory, so the whole stage runs offline.

The real Step-Audio2 / MiniCPM-o `token2wav/` directory cannot be downloaded on the build machines.
This module assembles one from the per-model stand-in generators, each of which reproduces the
shipped file's layout (names, shapes, exporter) with seeded weights:

| file                            | generator (component cache)                        | reduced size           |
|---------------------------------|----------------------------------------------------|------------------------|
| `campplus.onnx`                 | `campplus.standin.ensure_standin_campplus_onnx`    | full size (192-d)      |
| `speech_tokenizer_v2_25hz.onnx` | `speech_tokenizer.cached_standin_speech_tokenizer` | 128 wide, 2 blocks     |
| `flow.yaml` + `flow.pt`         | `flow.ensure_standin_flow`                         | d 64, 2+1 conformer    |
| `hift.pt`                       | `hift.cached_standin_hift`                         | 32 base channels       |
| `HT_ref_audio.wav`,             | the shipped CMU ARCTIC clip, 24 kHz 16-bit PCM     | same                   |
| `default_female.wav`            | (the families' default-voice names)                |                        |

Full size is the shipped geometry (~1.2 GB, what benchmarks use); reduced size keeps every
interface (80 mel bins, 192-d embedding, 6561 codes, 480 samples per frame) and runs the
end-to-end tests in seconds. Weights are random: the audio is noise-like, never speech.

`upstream_compatible=True` (reduced only; full size already is) keeps the parts whose size upstream's
loaders hard-code at real size, so vLLM-Omni 0.30's `StepAudio2Token2WavCore` (and MiniCPM-o's code2wav
built on it) loads the folder unchanged: the speech tokenizer (`s3tokenizer.load_model` builds the
shipped 1280-wide, 6-block encoder whatever the file holds) and `hift.pt` (its `_build_hift()` is the
shipped 24 kHz HiFT). The flow keeps its reduced size (upstream builds it from `flow.yaml`), CAM++ is
full size anyway. The folder is then 612 MB instead of 36 MB, mostly the 496 MB tokenizer (measured;
tests/model_executor/models/step_audio2/test_upstream_loaders.py loads it through upstream's loaders).

`layout="minicpmo-utils-1.0.7"` lays out MiniCPM-o's causal-vocoder variant instead (see
`minicpmo_4_5/variants.py`): `hift.pt` is then the causal HiFT (`cosyvoice3.hift` stand-in, same
size option), `hift_original.pt` the HiFT above and `config.yaml` the hyperpyyaml that builds the
causal one after CosyVoice's seed lines, with the Step-Audio2 mel settings minicpmo-utils requires
(`hift.yaml_config.render_vocoder_yaml`); minicpmo-utils 1.0.7's own `Token2wav` loads the directory
(reduced: with `upstream_compatible=True`, since its s3tokenizer and `HiFTGenerator()` for `hift_original.pt`
hard-code the real sizes; tests/model_executor/models/minicpmo_4_5/test_minicpmo_utils_1_0_7_loader.py).

`ensure_standin_token2wav_dir(reduced=..., seed=..., layout=...)` keeps one cached directory per
option set (files hard-linked from the component caches where the filesystem allows, else
copied); `write_standin_token2wav_dir(directory, ...)` fills a directory of the caller's choice.
CLI: `python -m vllm_omni_token2wav.model_executor.models.standin.token2wav_dir [--reduced [--upstream-compatible]]
[--seed N] [--layout step-audio2|minicpmo-utils-1.0.7] [--out DIR]`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

#: Bump when the recipe (component versions or file set) changes so cached directories are rebuilt.
STANDIN_DIR_VERSION = 2
MANIFEST_NAME = ".manifest.json"
#: The manifest whose assets are in the stand-in registry (`known_files.record_standin`).
_REGISTERED = ".registered.json"
#: Default-voice file names the stage looks for (MiniCPM-o, Step-Audio2): both ship the ARCTIC clip.
DEFAULT_VOICE_FILES = ("HT_ref_audio.wav", "default_female.wav")
#: Directory layouts: Step-Audio2's five files (also MiniCPM-o as vLLM-Omni serves it), or MiniCPM-o's
#: causal-vocoder variant (minicpmo-utils 1.0.7: + config.yaml, causal hift.pt, hift_original.pt).
STEP_AUDIO2_LAYOUT = "step-audio2"
MINICPMO_1_0_7_LAYOUT = "minicpmo-utils-1.0.7"
LAYOUTS = (STEP_AUDIO2_LAYOUT, MINICPMO_1_0_7_LAYOUT)


def default_voice_wav() -> bytes:
    """The shipped real speech clip as a 24 kHz mono 16-bit WAV: the stand-in directory's default voice.

    Written with soundfile when installed, else with the standard library's `wave` module and the
    same float -> int16 conversion (`pcm16_wav`), so hosts with only the core dependencies (the
    accelerator images the device check runs on) build the same directory.
    """
    from vllm_omni_token2wav.assets.audio import speech_sample
    from vllm_omni_token2wav.model_executor.models import audio as frontend

    wav, rate = speech_sample()
    at_24k = frontend.load_audio((wav, rate), 24000).numpy()
    try:
        import soundfile
    except ImportError:
        return pcm16_wav(at_24k, 24000)
    buffer = io.BytesIO()
    soundfile.write(buffer, at_24k, 24000, subtype="PCM_16", format="WAV")
    return buffer.getvalue()


def pcm16_wav(samples: np.ndarray, rate: int) -> bytes:
    """Mono float samples in [-1, 1] as a 16-bit PCM WAV: floor(x * 32768), clipped, as libsndfile writes PCM_16
    (checked sample for sample against python-soundfile in
    tests/model_executor/models/standin/test_token2wav_dir.py)."""
    pcm = np.clip(np.floor(np.asarray(samples, dtype=np.float64) * 32768.0), -32768, 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(int(rate))
        f.writeframes(pcm.tobytes())
    return buffer.getvalue()


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown token2wav stand-in layout {layout!r}; choose one of {LAYOUTS}")


def _component_files(
    *, reduced: bool, seed: int, layout: str = STEP_AUDIO2_LAYOUT, upstream_compatible: bool = False
) -> dict[str, Path]:
    """Token2wav file name -> cached component stand-in (generated on first use).

    `upstream_compatible`: the speech tokenizer and HiFT at real size even when `reduced` (module docstring).
    """
    from vllm_omni_token2wav.model_executor.layers.flow import ensure_standin_flow
    from vllm_omni_token2wav.model_executor.layers.flow.loader import FLOW_PT, FLOW_YAML
    from vllm_omni_token2wav.model_executor.layers.hift import cached_standin_hift
    from vllm_omni_token2wav.model_executor.layers.speech_tokenizer import cached_standin_speech_tokenizer
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    _check_layout(layout)
    # Sizes upstream's loaders hard-code (s3tokenizer's encoder, vLLM-Omni's `_build_hift()`).
    fixed_size_reduced = reduced and not upstream_compatible
    flow_dir = ensure_standin_flow(reduced=reduced, seed=seed)
    files = {
        # CAM++ stays full size: the reduced stand-in has a 64-d embedding, the flow model needs 192.
        "campplus.onnx": ensure_standin_campplus_onnx(seed=seed),
        "speech_tokenizer_v2_25hz.onnx": cached_standin_speech_tokenizer(reduced=fixed_size_reduced, seed=seed),
        "flow.yaml": flow_dir / FLOW_YAML,
        "flow.pt": flow_dir / FLOW_PT,
        "hift.pt": cached_standin_hift(reduced=fixed_size_reduced, seed=seed),
    }
    if layout == MINICPMO_1_0_7_LAYOUT:
        from vllm_omni_token2wav.model_executor.layers.hift_causal import cached_standin_causal_hift
        from vllm_omni_token2wav.model_executor.models.token2wav_core.causal_vocoder import WHOLE_UTTERANCE_HIFT

        files[WHOLE_UTTERANCE_HIFT] = files["hift.pt"]
        files["hift.pt"] = cached_standin_causal_hift(reduced=reduced, seed=seed)
    return files


def _generated_files(*, reduced: bool, layout: str) -> dict[str, bytes]:
    """Files written from text rather than linked: the causal vocoder's config.yaml (1.0.7 layout)."""
    if layout != MINICPMO_1_0_7_LAYOUT:
        return {}
    from vllm_omni_token2wav.model_executor.layers.hift_causal import (
        FULL_CAUSAL_HIFT_CONFIG,
        REDUCED_CAUSAL_HIFT_CONFIG,
    )
    from vllm_omni_token2wav.model_executor.layers.hift_causal.yaml_config import render_vocoder_yaml
    from vllm_omni_token2wav.model_executor.models.token2wav_core.causal_vocoder import (
        STEP_AUDIO2_VOCODER_MEL,
        VOCODER_CONFIG,
    )

    config = REDUCED_CAUSAL_HIFT_CONFIG if reduced else FULL_CAUSAL_HIFT_CONFIG
    text = render_vocoder_yaml(
        config, feat_extractor=STEP_AUDIO2_VOCODER_MEL, header="MiniCPM-o causal vocoder, stand-in (1.0.7 layout)"
    )
    return {VOCODER_CONFIG: text.encode()}


def _place(source: Path, target: Path) -> None:
    """Hard-link `source` to `target` (same filesystem), else copy it; atomic via a temporary name."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def write_standin_token2wav_dir(
    directory: str | os.PathLike[str],
    *,
    reduced: bool,
    seed: int = 0,
    layout: str = STEP_AUDIO2_LAYOUT,
    upstream_compatible: bool = False,
) -> Path:
    """Fill `directory` with a complete stand-in token2wav set (existing files of those names are replaced)."""
    directory = Path(directory)
    files = {**_generated_files(reduced=reduced, layout=layout), **_voice_files()}
    sources = _component_files(reduced=reduced, seed=seed, layout=layout, upstream_compatible=upstream_compatible)
    fill_standin_dir(directory, sources, files)
    size = _size_name(reduced, upstream_compatible)
    logger.info("wrote %s stand-in token2wav directory (%s, seed %d) to %s", size, layout, seed, directory)
    return directory


def _voice_files() -> dict[str, bytes]:
    """The default voice clips (`DEFAULT_VOICE_FILES`), all the shipped speech sample at 24 kHz."""
    return dict.fromkeys(DEFAULT_VOICE_FILES, default_voice_wav())


def fill_standin_dir(directory: Path, sources: dict[str, Path], files: dict[str, bytes] | None = None) -> None:
    """Place `sources` (hard link or copy) and write `files` (default: the default voices) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        _place(source, directory / name)
    for name, data in (_voice_files() if files is None else files).items():
        write_bytes_atomic(directory / name, data)


def _size_name(reduced: bool, upstream_compatible: bool) -> str:
    """`full`, `reduced`, or `reduced-upstream` (reduced with the sizes upstream hard-codes at real size)."""
    if not reduced:
        return "full"
    return "reduced-upstream" if upstream_compatible else "reduced"


def standin_token2wav_dir(
    *, reduced: bool, seed: int = 0, layout: str = STEP_AUDIO2_LAYOUT, upstream_compatible: bool = False
) -> Path:
    """Cache folder of the stand-in directory for these options (under `vllm_omni_token2wav.envs.cache_dir`)."""
    from vllm_omni_token2wav import envs

    _check_layout(layout)
    size = _size_name(reduced, upstream_compatible)
    suffix = "" if layout == STEP_AUDIO2_LAYOUT else f"-{layout}"
    return envs.cache_dir("standins", f"token2wav-v{STANDIN_DIR_VERSION}-{size}-seed{seed}{suffix}")


def ensure_standin_token2wav_dir(
    *, reduced: bool, seed: int = 0, layout: str = STEP_AUDIO2_LAYOUT, upstream_compatible: bool = False
) -> Path:
    """The cached stand-in token2wav directory, assembled first if missing or stale (safe across processes)."""
    options: dict[str, Any] = dict(reduced=reduced, seed=seed, layout=layout, upstream_compatible=upstream_compatible)
    directory = standin_token2wav_dir(**options)
    sources = _component_files(**options)
    files = {**_generated_files(reduced=reduced, layout=layout), **_voice_files()}
    return ensure_assembled(directory, sources, {}, files)


def ensure_assembled(
    directory: Path,
    sources: dict[str, Path],
    recipe: dict[str, object],
    files: dict[str, bytes],
) -> Path:
    """`directory` assembled from component files `sources` plus generated `files`, unless already current.

    The component caches are versioned by their own generators; the directory's manifest (the source
    paths, `recipe` and the digest of every generated file) is written after every asset, so a reader
    never sees a half-assembled directory, and a regenerated component (new version) or generated file
    is picked up. The default voices' bytes depend on the resampler the front end finds (python-soxr,
    or the device check's stand-in for it on images without soxr): their digests make a directory built
    by one stale for the other. Safe across processes (file lock).
    """
    from filelock import FileLock  # a torch dependency: always installed alongside torch

    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    sourced = {name: str(path) for name, path in sources.items()}
    manifest = json.dumps({**sourced, **recipe, "generated": digests}, sort_keys=True)
    marker = directory / MANIFEST_NAME
    if marker.is_file() and marker.read_text() == manifest:
        _register_assets(directory, manifest)
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory / ".write.lock")):
        if not (marker.is_file() and marker.read_text() == manifest):
            fill_standin_dir(directory, sources, files)
            write_bytes_atomic(marker, manifest.encode())
            logger.info("assembled stand-in token2wav directory %s", directory)
        _register_assets(directory, manifest)
    return directory


def _register_assets(directory: Path, manifest: str) -> None:
    """Record every asset of `directory` in the stand-in registry (`known_files`), once per manifest."""
    marker = directory / _REGISTERED
    if marker.is_file() and marker.read_text() == manifest:
        return
    from vllm_omni_token2wav.known_files import record_standin

    for path in sorted(directory.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            record_standin(path, recipe=f"stand-in {directory.name}/{path.name}")
    write_bytes_atomic(marker, manifest.encode())


def standin_main(
    argv: list[str] | None,
    *,
    prog: str,
    what: str,
    write: Callable[..., Path],
    ensure: Callable[..., Path],
    layouts: tuple[str, ...] = (),
    upstream_option: bool = False,
) -> int:
    """The stand-in modules' command line: write `--out DIR` (or find the cached directory) and print its path.

    `layouts` (first = default) adds `--layout`, passed on to `write` / `ensure`; `upstream_option` adds
    `--upstream-compatible` (passed on as `upstream_compatible`).
    """
    parser = argparse.ArgumentParser(
        prog=prog, description=f"Write (or find in the cache) a deterministic stand-in {what} and print its path."
    )
    parser.add_argument("--reduced", action="store_true", help="reduced widths/depths (fast tests)")
    parser.add_argument("--seed", type=int, default=0)
    if layouts:
        parser.add_argument(
            "--layout", choices=layouts, default=layouts[0], help="file set (MiniCPM-o 1.0.7: causal vocoder)"
        )
    if upstream_option:
        parser.add_argument(
            "--upstream-compatible",
            action="store_true",
            help="with --reduced: the speech tokenizer and HiFT at the real size upstream's loaders hard-code",
        )
    parser.add_argument("--out", type=Path, default=None, help="directory to fill (default: the cache)")
    args = parser.parse_args(argv)
    options: dict[str, object] = {"reduced": args.reduced, "seed": args.seed}
    if layouts:
        options["layout"] = args.layout
    if upstream_option:
        options["upstream_compatible"] = args.upstream_compatible
    if args.out is not None:
        path = write(args.out, **options)
    else:
        path = ensure(**options)
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    return standin_main(
        argv,
        prog="python -m vllm_omni_token2wav.model_executor.models.standin.token2wav_dir",
        what="token2wav directory",
        write=write_standin_token2wav_dir,
        ensure=ensure_standin_token2wav_dir,
        layouts=LAYOUTS,
        upstream_option=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
