# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav token2wav`: synthesise a WAV file from speech token ids and a prompt voice.

Each family's Token2Wav facade (`facade_class` of its `family.py`: `StepAudio2Token2WavCore`,
`MiniCPMO45Token2WavCore`, `CosyVoice3Token2Wav`) from the command line, for
checking a model directory or a token dump from the LLM stage without writing Python:

    vllm-omni-token2wav token2wav --tokens 1,2,3,... --prompt voice.wav --out reply.wav
    vllm-omni-token2wav token2wav --tokens-file tokens.txt --prompt voice.wav --out reply.wav --stream
    vllm-omni-token2wav token2wav --standin reduced --tokens random:250 --out noise.wav   # offline, no assets
    vllm-omni-token2wav token2wav --family cosyvoice3 --standin reduced --tokens random:250 --out noise.wav --stream

`--family step_audio2` (default) or `minicpmo_4_5` (the same assets; vLLM-Omni 0.30's streaming rules: silence
lookahead, conformer cache trimmed): `--model-dir` is a token2wav directory (campplus.onnx,
speech_tokenizer_v2_25hz.onnx, flow.yaml, flow.pt, hift.pt); `--prompt` defaults to the shipped speech clip;
`--stream` runs 25-token chunks + 3 lookahead.
`--family cosyvoice3`: `--model-dir` is a Fun-CosyVoice3 directory (campplus.onnx, flow.pt, hift.pt,
cosyvoice3.yaml); the prompt needs its speech tokens (`--prompt-tokens` / `--prompt-tokens-file`, else
the `<prompt>.tokens` file beside it; without `--prompt`, the directory's `default_voice.wav` +
`default_voice.tokens`); `--stream` follows upstream's schedule (25 + pad, 50, 100, ... tokens).
`--standin reduced|full` uses the family's deterministic stand-in directory (random weights:
noise-like audio, real costs). The WAV (24 kHz, 16-bit) is written atomically. Heavy imports happen
inside `run`.

Refused before any work (exit 2, one `vllm-omni-token2wav: error:` line): an `--out` that cannot be written
(a folder, a missing or read-only folder) or whose name does not end in `.wav` (only WAV is
written: `reply.mp3` would be a WAV under a name that says otherwise), and a `--prompt` the audio
front end refuses as a voice (missing, undecodable, silent, a click or a beep, too short or long).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_omni_token2wav.cli_types import CLIUsageError

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import Family

VOCAB_SIZE = 6561
_RANDOM = re.compile(r"random:(\d+)(?::(\d+))?$")


def parse_tokens(text: str) -> list[int]:
    """`1,2,3` / `1 2 3` (commas, spaces or newlines), or `random:N[:SEED]` for N seeded random codes."""
    match = _RANDOM.match(text.strip())
    if match:
        import torch

        count, seed = int(match.group(1)), int(match.group(2) or 0)
        if count < 1:
            raise CLIUsageError("random:N needs N >= 1")
        return torch.randint(0, VOCAB_SIZE, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if not parts:
        raise CLIUsageError("no speech tokens given (e.g. --tokens 12,345,6000 or --tokens random:250)")
    try:
        tokens = [int(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise CLIUsageError(f"speech token {bad!r} is not an integer") from None
    out_of_range = [t for t in tokens if not 0 <= t < VOCAB_SIZE]
    if out_of_range:
        raise CLIUsageError(f"speech token {out_of_range[0]} is outside [0, {VOCAB_SIZE})")
    return tokens


def cli_families() -> tuple[str, ...]:
    """The `--family` choices: each registered family's `cli_name` (`token2wav_stage/families.py`; light import)."""
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import registered_families

    return tuple(f.cli_name for f in registered_families() if f.cli_name)


def _family(cli_name: str) -> Family:
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import registered_families

    return next(f for f in registered_families() if f.cli_name == cli_name)


class Token2WavCommand:
    name = "token2wav"
    help = "synthesise a 24 kHz WAV from speech token ids in the voice of a prompt clip"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--tokens", help="token ids (comma/space separated) or random:N[:SEED]")
        source.add_argument("--tokens-file", type=Path, help="text file of token ids")
        assets = parser.add_mutually_exclusive_group()
        assets.add_argument("--model-dir", type=Path, help="token2wav directory with the five asset files")
        assets.add_argument(
            "--standin", choices=("reduced", "full"), help="use the deterministic stand-in directory (no real assets)"
        )
        parser.add_argument(
            "--family",
            choices=cli_families(),
            default="step_audio2",
            help="model family of the directory: its facade and streaming rules (MiniCPM-o: vLLM-Omni 0.30's variant)",
        )
        parser.add_argument("--prompt", type=Path, help="prompt voice (audio file); default: the shipped speech clip")
        prompt_tokens = parser.add_mutually_exclusive_group()
        prompt_tokens.add_argument("--prompt-tokens", help="cosyvoice3: the prompt's speech token ids")
        prompt_tokens.add_argument("--prompt-tokens-file", type=Path, help="cosyvoice3: file of the prompt's ids")
        parser.add_argument("--out", type=Path, required=True, help="output WAV path (*.wav)")
        parser.add_argument("--stream", action="store_true", help="use the streaming path (25-token chunks)")
        parser.add_argument("--n-timesteps", type=int, default=10, help="flow-matching steps (default 10)")
        parser.add_argument("--device", default=None, help="device (default: the serving platform's)")
        parser.add_argument("--seed", type=int, default=0, help="NSF noise seed")

    def run(self, args: argparse.Namespace) -> int:
        tokens = self._tokens(args)
        if args.n_timesteps < 1:
            raise CLIUsageError(f"--n-timesteps must be >= 1, got {args.n_timesteps}")
        if args.prompt is not None and not args.prompt.is_file():
            raise CLIUsageError(f"--prompt {args.prompt} does not exist")
        if args.model_dir is None and args.standin is None:
            raise CLIUsageError("give --model-dir DIR (a token2wav directory) or --standin reduced|full")
        if args.model_dir is not None and not args.model_dir.is_dir():
            raise CLIUsageError(f"--model-dir {args.model_dir} is not a directory")
        own_flow = _family(args.family).spec.cosyvoice2_flow is None  # CosyVoice3: its own flow and facade
        if not own_flow and (args.prompt_tokens is not None or args.prompt_tokens_file is not None):
            raise CLIUsageError("--prompt-tokens / --prompt-tokens-file are for --family cosyvoice3")
        if args.prompt_tokens_file is not None and not args.prompt_tokens_file.is_file():
            raise CLIUsageError(f"--prompt-tokens-file {args.prompt_tokens_file} does not exist")
        _check_out(args.out)
        if args.prompt is not None:
            _check_prompt(args.prompt)
        if own_flow:
            return _synthesise_cosyvoice3(args, tokens)
        return _synthesise(args, tokens)

    @staticmethod
    def _tokens(args: argparse.Namespace) -> list[int]:
        if args.tokens_file is not None:
            if not args.tokens_file.is_file():
                raise CLIUsageError(f"--tokens-file {args.tokens_file} does not exist")
            return parse_tokens(args.tokens_file.read_text())
        return parse_tokens(args.tokens)


def _check_out(out: Path) -> None:
    """Refuse an unusable `--out` before any model is loaded (a folder, a missing or read-only folder, a
    name that does not end in .wav: the file is always WAV)."""
    if out.is_dir():
        raise CLIUsageError(f"--out {out}: is a folder; give the WAV file name to write (e.g. {out / 'reply.wav'})")
    if out.suffix.lower() != ".wav":
        kind = f"a {out.suffix!r} name" if out.suffix else "a name without an extension"
        raise CLIUsageError(
            f"--out {out}: {kind}, but the output is a WAV file (24 kHz, 16-bit PCM); name it *.wav "
            f"(e.g. {out.with_name(out.stem + '.wav')})"
        )
    folder = out.parent
    if not folder.is_dir():
        raise CLIUsageError(f"--out: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CLIUsageError(f"--out: folder {folder} is not writable")


def _check_prompt(prompt: Path) -> None:
    """Refuse a `--prompt` the front end refuses as a voice (the rules of `load_prompt_audio`), before any
    model or stand-in directory is built; the facades would raise the same error at the first request."""
    from vllm_omni_token2wav.model_executor.models import audio as frontend

    try:
        frontend.load_prompt_audio(str(prompt))
    except frontend.AudioTooLongError as exc:
        raise CLIUsageError(
            f"--prompt {exc.origin}: {exc.seconds:.2f} s long, over the {exc.max_seconds:g} s prompt limit; "
            f"cut it to at most {exc.max_seconds:g} s"
        ) from None
    except (ValueError, FileNotFoundError) as exc:
        raise CLIUsageError(f"--prompt: {exc}") from None


def _synthesise(args: argparse.Namespace, tokens: list[int]) -> int:
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir
    from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import import_target

    _standin_note(args, "token2wav")
    model_dir = args.model_dir or ensure_standin_token2wav_dir(reduced=args.standin == "reduced")
    prompt: Any
    if args.prompt is not None:
        prompt = str(args.prompt)
    else:
        from vllm_omni_token2wav.assets.audio import speech_sample

        prompt = speech_sample()
    family = _family(args.family)  # a family on the shared core: its facade and its stream rules
    spec = family.spec
    if family.serving.facade_class is None:
        raise CLIUsageError(f"--family {args.family}: the family names no Token2Wav facade (facade_class)")
    facade = import_target(family.serving.facade_class)
    try:
        core = facade(
            model_dir,
            device=args.device,
            n_timesteps=args.n_timesteps,
            seed=args.seed,
            stream_lookahead=spec.lookahead,
            conformer_trim=spec.conformer_trim,
        )
        core.check_assets()
    except (FileNotFoundError, ValueError) as exc:
        raise CLIUsageError(str(exc)) from None
    start = time.perf_counter()
    if args.stream:
        state = core.set_stream_cache(prompt)
        calls = [
            (
                len(chunk),
                lambda chunk=chunk, last=last: core.stream(chunk, last_chunk=last, return_waveform=True, state=state),
            )
            for chunk, last in stream_chunks(tokens)
        ]
        audio = _stream(calls, start)
    else:
        audio = core(tokens, prompt)
    return _write(args, tokens, audio, time.perf_counter() - start, str(core.device))


def _cosyvoice3_prompt(args: argparse.Namespace, model_dir: Path) -> tuple[str, list[int]]:
    """(prompt audio path, its speech tokens) from the options, the `.tokens` file, or the default voice."""
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import voice_tokens_path

    prompt = args.prompt if args.prompt is not None else model_dir / "default_voice.wav"
    if not prompt.is_file():
        raise CLIUsageError(f"no prompt voice: give --prompt CLIP.wav ({prompt} does not exist)")
    if args.prompt_tokens is not None:
        return str(prompt), parse_tokens(args.prompt_tokens)
    source = args.prompt_tokens_file if args.prompt_tokens_file is not None else voice_tokens_path(prompt)
    if not source.is_file():
        raise CLIUsageError(
            f"CosyVoice3 needs the prompt's speech tokens: give --prompt-tokens or --prompt-tokens-file "
            f"(or put them in {source}); the speech tokenizer v3 is not in-tree"
        )
    return str(prompt), parse_tokens(source.read_text())


def _synthesise_cosyvoice3(args: argparse.Namespace, tokens: list[int]) -> int:
    import torch

    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import (
        CosyVoice3Token2Wav,
        upstream_chunks,
    )
    from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

    _standin_note(args, "CosyVoice3")
    model_dir = args.model_dir or ensure_standin_cosyvoice3_dir(reduced=args.standin == "reduced")
    prompt, prompt_ids = _cosyvoice3_prompt(args, model_dir)
    try:
        core = CosyVoice3Token2Wav(model_dir, device=args.device, n_timesteps=args.n_timesteps, seed=args.seed)
        core.check_assets()
        voice = core.prompt(prompt, prompt_ids)
    except (FileNotFoundError, ValueError) as exc:
        raise CLIUsageError(str(exc)) from None
    start = time.perf_counter()
    if args.stream:
        state = core.set_stream_cache(prompt=voice)
        ids = torch.tensor(tokens, dtype=torch.long)
        calls = [
            (
                part.stop - part.start,
                lambda part=part, last=last: core.stream(ids[part], last_chunk=last, return_waveform=True, state=state),
            )
            for part, last in upstream_chunks(len(tokens), voice.num_tokens)
        ]
        audio = _stream(calls, start)
    else:
        audio = core(tokens, prompt=voice)
    return _write(args, tokens, audio, time.perf_counter() - start, str(core.device))


def _standin_note(args: argparse.Namespace, what: str) -> None:
    if args.standin is not None:
        print(
            f"note: --standin {args.standin} uses a stand-in {what} directory with RANDOM weights: the audio is "
            "quiet noise, not speech (timings are real); give --model-dir for real assets"
        )


def _stream(calls: list[tuple[int, Callable[[], Any]]], start: float) -> Any:
    """Run the chunks in order (`(tokens, call)` pairs), report each one, return their audio concatenated."""
    import torch

    pieces = []
    for i, (count, call) in enumerate(calls):
        piece = call()
        assert isinstance(piece, torch.Tensor)
        pieces.append(piece)
        print(f"chunk {i}: {count} tokens -> {piece.shape[-1]} samples at {time.perf_counter() - start:.2f} s")
    return torch.cat(pieces, dim=1)


def _write(args: argparse.Namespace, tokens: list[int], audio: Any, elapsed: float, device: str) -> int:
    import soundfile

    from vllm_omni_token2wav.atomic_io import atomic_output

    rate = 24_000
    samples = audio.detach().float().cpu().numpy().reshape(-1)
    with atomic_output(args.out) as tmp:
        soundfile.write(str(tmp), samples, rate, subtype="PCM_16", format="WAV")
    seconds = samples.shape[0] / rate
    print(
        f"wrote {args.out}: {len(tokens)} tokens -> {seconds:.2f} s of 24 kHz audio in {elapsed:.2f} s "
        f"(RTF {elapsed / seconds:.2f}, {'streaming' if args.stream else 'whole utterance'}, {device})"
    )
    return 0


SUBCOMMAND = Token2WavCommand()
