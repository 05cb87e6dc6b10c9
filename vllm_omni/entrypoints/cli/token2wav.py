# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni token2wav`: synthesise a WAV file from speech token ids and a prompt voice.

The stage's API (`StepAudio2Token2WavCore`) from the command line, for checking a token2wav
directory or a token dump from the LLM stage without writing Python:

    vllm-omni token2wav --tokens 1,2,3,... --prompt voice.wav --out reply.wav
    vllm-omni token2wav --tokens-file tokens.txt --prompt voice.wav --out reply.wav --stream
    vllm-omni token2wav --standin reduced --tokens random:250 --out noise.wav   # offline, no assets

`--model-dir` is a token2wav directory (campplus.onnx, speech_tokenizer_v2_25hz.onnx, flow.yaml,
flow.pt, hift.pt); `--standin reduced|full` uses the deterministic stand-in directory instead
(random weights: noise-like audio, real costs). `--prompt` defaults to the shipped speech clip.
`--stream` runs the streaming path (25-token chunks + 3 lookahead) and reports each chunk.
The WAV (24 kHz, 16-bit) is written atomically. Heavy imports happen inside `run`.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import Any

from vllm_omni.entrypoints.cli.types import CLIUsageError

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
        parser.add_argument("--prompt", type=Path, help="prompt voice (audio file); default: the shipped speech clip")
        parser.add_argument("--out", type=Path, required=True, help="output WAV path")
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
        _check_out(args.out)
        return _synthesise(args, tokens)

    @staticmethod
    def _tokens(args: argparse.Namespace) -> list[int]:
        if args.tokens_file is not None:
            if not args.tokens_file.is_file():
                raise CLIUsageError(f"--tokens-file {args.tokens_file} does not exist")
            return parse_tokens(args.tokens_file.read_text())
        return parse_tokens(args.tokens)


def _check_out(out: Path) -> None:
    """Refuse an unusable `--out` before any model is loaded (a folder, a missing or read-only folder)."""
    if out.is_dir():
        raise CLIUsageError(f"--out {out}: is a folder; give the WAV file name to write (e.g. {out / 'reply.wav'})")
    folder = out.parent
    if not folder.is_dir():
        raise CLIUsageError(f"--out: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CLIUsageError(f"--out: folder {folder} is not writable")


def _synthesise(args: argparse.Namespace, tokens: list[int]) -> int:
    import soundfile
    import torch

    from vllm_omni.atomic_io import atomic_output
    from vllm_omni.model_executor.models.step_audio2.standin import ensure_standin_token2wav_dir
    from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore
    from vllm_omni.model_executor.models.step_audio2.token2wav_stream import OUTPUT_SAMPLE_RATE, stream_chunks

    if args.standin is not None:
        print(
            f"note: --standin {args.standin} uses a stand-in token2wav directory with RANDOM weights: the audio is "
            "quiet noise, not speech (timings are real); give --model-dir for real assets"
        )
    model_dir = args.model_dir or ensure_standin_token2wav_dir(reduced=args.standin == "reduced")
    prompt: Any
    if args.prompt is not None:
        prompt = str(args.prompt)
    else:
        from vllm_omni.assets.audio import speech_sample

        prompt = speech_sample()
    try:
        core = StepAudio2Token2WavCore(model_dir, device=args.device, n_timesteps=args.n_timesteps, seed=args.seed)
        core.check_assets()
    except (FileNotFoundError, ValueError) as exc:
        raise CLIUsageError(str(exc)) from None
    start = time.perf_counter()
    if args.stream:
        state = core.set_stream_cache(prompt)
        pieces = []
        for i, (chunk, last) in enumerate(stream_chunks(tokens)):
            piece = core.stream(chunk, last_chunk=last, return_waveform=True, state=state)
            assert isinstance(piece, torch.Tensor)
            pieces.append(piece)
            print(f"chunk {i}: {len(chunk)} tokens -> {piece.shape[-1]} samples at {time.perf_counter() - start:.2f} s")
        audio = torch.cat(pieces, dim=1)
    else:
        audio = core(tokens, prompt)
    elapsed = time.perf_counter() - start
    samples = audio.detach().float().cpu().numpy().reshape(-1)
    with atomic_output(args.out) as tmp:
        soundfile.write(str(tmp), samples, OUTPUT_SAMPLE_RATE, subtype="PCM_16", format="WAV")
    seconds = samples.shape[0] / OUTPUT_SAMPLE_RATE
    print(
        f"wrote {args.out}: {len(tokens)} tokens -> {seconds:.2f} s of 24 kHz audio in {elapsed:.2f} s "
        f"(RTF {elapsed / seconds:.2f}, {'streaming' if args.stream else 'whole utterance'}, {core.device})"
    )
    return 0


SUBCOMMAND = Token2WavCommand()
