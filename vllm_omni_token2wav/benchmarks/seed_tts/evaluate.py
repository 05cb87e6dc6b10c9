# SPDX-License-Identifier: Apache-2.0
"""Score a folder of generated Seed-TTS utterances (`<gen_dir>/<utt>.wav`) against a meta file.

This is the WER gate that decides whether a speed change kept speech quality: it does what the official
run_wer.py does (ASR, normalisation, mean of per-utterance WER) but never loses or hides an utterance:

- every expected utterance ends as one row in `scores.jsonl` (appended as it completes, see
  `seed_tts_results`): "ok" with its WER, or a failure status (missing / unreadable audio, ASR error);
- the summary (`summary.json`, written atomically) reports the official-compatible number (failures left
  out, as run_wer.py silently does) next to the strict one (failures score WER 1.0);
- `resume=True` keeps "ok" rows of an earlier run and retries everything else.

The ASR is any `ASRBackend`; `serve` mode (seed_tts_serve) reuses this scorer on the audio it received.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.atomic_io import atomic_output
from vllm_omni_token2wav.benchmarks.progress import progress as progress_bar
from vllm_omni_token2wav.benchmarks.seed_tts.asr import ASRBackend
from vllm_omni_token2wav.benchmarks.seed_tts.asr.audio import ASR_SAMPLE_RATE, AudioReadError, read_audio_for_asr
from vllm_omni_token2wav.benchmarks.seed_tts.dataset import SeedTTSDataset
from vllm_omni_token2wav.benchmarks.seed_tts.results import JsonlLog, read_jsonl_rows, write_json_atomic
from vllm_omni_token2wav.benchmarks.seed_tts.wer import (
    STATUS_ASR_FAILED,
    STATUS_MISSING_AUDIO,
    STATUS_OK,
    STATUS_UNREADABLE_AUDIO,
    normalize_for_wer,
    summarize,
    word_errors,
)
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

SCORES_FILE = "scores.jsonl"
SUMMARY_FILE = "summary.json"
HISTOGRAM_FILE = "wer_hist.png"
# A backend that fails on this many items in a row before any success is broken (wrong device, missing
# weights): stop instead of writing a thousand identical failure rows.
MAX_LEADING_ASR_FAILURES = 5

AudioReader = Callable[[Path], Any]


@dataclass
class ScoreRow:
    """One utterance's outcome; `wer` is a fraction (the summary reports percentages)."""

    utt: str
    status: str
    ref: str
    ref_norm: str
    ref_words: int
    hyp: str = ""
    hyp_norm: str = ""
    wer: float | None = None
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    hits: int = 0
    audio_s: float | None = None
    asr_s: float | None = None
    wav: str = ""
    error: str = ""


@dataclass
class ScoreReport:
    summary: dict[str, Any]
    rows: dict[str, dict[str, Any]]
    out_dir: Path
    interrupted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def summary_path(self) -> Path:
        return self.out_dir / SUMMARY_FILE


def _references(dataset: SeedTTSDataset) -> dict[str, tuple[str, int]]:
    """Normalised reference and its word count per utterance; an empty one is a data error, raised up front."""
    refs: dict[str, tuple[str, int]] = {}
    for item in dataset.items:
        ref_norm = normalize_for_wer(item.target_text, dataset.locale)
        n = len(ref_norm.split())
        if n == 0:
            raise ValueError(
                f"{dataset.meta_path}:{item.line_no}: target text of {item.utt!r} is empty after Seed-TTS "
                f"normalisation ({item.target_text!r}); WER is undefined for it"
            )
        refs[item.utt] = (ref_norm, n)
    return refs


def score_one(
    utt: str, ref: str, ref_norm: str, ref_words: int, wav: Path, asr: ASRBackend, locale: str, reader: AudioReader
) -> ScoreRow:
    """Score one generated file. Expected problems become a failure row; only unexpected ones raise."""
    row = ScoreRow(utt=utt, status=STATUS_OK, ref=ref, ref_norm=ref_norm, ref_words=ref_words, wav=str(wav))
    if not wav.is_file():
        row.status, row.error = STATUS_MISSING_AUDIO, f"{wav} does not exist"
        return row
    try:
        audio = reader(wav)
    except AudioReadError as exc:
        row.status, row.error = STATUS_UNREADABLE_AUDIO, str(exc)
        return row
    row.audio_s = round(len(audio) / ASR_SAMPLE_RATE, 3)
    t0 = time.perf_counter()
    try:
        hyp = asr(audio)
    except Exception as exc:  # one bad item must not end a 1000-item run; the caller stops broken backends
        row.status, row.error = STATUS_ASR_FAILED, f"{type(exc).__name__}: {exc}"
        return row
    row.asr_s = round(time.perf_counter() - t0, 3)
    row.hyp = hyp
    row.hyp_norm = normalize_for_wer(hyp, locale)
    counts = word_errors(ref_norm, row.hyp_norm)
    row.substitutions, row.deletions, row.insertions, row.hits = (
        counts.substitutions,
        counts.deletions,
        counts.insertions,
        counts.hits,
    )
    row.wer = counts.wer
    if not row.hyp_norm.strip():
        logger.warning("%s: empty transcription of %s (scored as all words deleted)", utt, wav)
    return row


def score_generated(
    dataset: SeedTTSDataset,
    gen_dir: str | Path,
    asr: ASRBackend,
    out_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = False,
    histogram: bool = False,
    extra_summary: Mapping[str, Any] | None = None,
    reader: AudioReader = read_audio_for_asr,
    started_at: float | None = None,
) -> ScoreReport:
    """Score `<gen_dir>/<utt>.wav` for every item; write `scores.jsonl` + `summary.json` under `out_dir`.

    `progress`: a bar on a terminal, plain periodic lines otherwise (`benchmarks.progress`).
    `started_at` (a `time.perf_counter()` value) is where the summary's `elapsed_s` counts from when
    earlier phases belong to the run (serve mode's requests); default: this call.
    """
    gen = Path(gen_dir)
    out = Path(out_dir)
    if not gen.is_dir():
        raise FileNotFoundError(f"generated-audio folder not found: {gen}")
    out.mkdir(parents=True, exist_ok=True)
    refs = _references(dataset)
    log_path = out / SCORES_FILE
    rows = {k: v for k, v in read_jsonl_rows(log_path).items() if k in refs} if resume else {}
    done = {utt for utt, row in rows.items() if row.get("status") == STATUS_OK}
    todo = [item for item in dataset.items if item.utt not in done]
    if resume:
        logger.info("resume: %d of %d utterances already scored, %d to go", len(done), len(dataset), len(todo))
    start = time.perf_counter() if started_at is None else started_at
    interrupted = False
    leading_failures = 0
    any_ok = bool(done)
    bar = progress_bar(len(dataset), f"ASR {asr.name}", "utt", initial=len(done), enabled=progress)
    try:
        with JsonlLog(log_path, resume=resume) as log:
            for item in todo:
                ref_norm, n = refs[item.utt]
                row = score_one(
                    item.utt, item.target_text, ref_norm, n, gen / f"{item.utt}.wav", asr, dataset.locale, reader
                )
                record = asdict(row)
                log.append(record)
                rows[item.utt] = record
                bar.update(1)
                if row.status == STATUS_OK:
                    any_ok = True
                elif row.status == STATUS_ASR_FAILED and not any_ok:
                    leading_failures += 1
                    if leading_failures >= MAX_LEADING_ASR_FAILURES:
                        raise RuntimeError(
                            f"ASR {asr.name} ({asr.model_id}) failed on the first {leading_failures} utterances; "
                            f"last error: {row.error}"
                        )
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        bar.close()
        elapsed = time.perf_counter() - start
        summary = build_summary(dataset, gen, asr, rows, elapsed, interrupted, extra_summary)
        write_json_atomic(out / SUMMARY_FILE, summary)
    if histogram:
        write_histogram(rows, out / HISTOGRAM_FILE, title=f"Seed-TTS {dataset.locale} per-utterance WER")
    return ScoreReport(summary=summary, rows=rows, out_dir=out, interrupted=interrupted)


def build_summary(
    dataset: SeedTTSDataset,
    gen_dir: Path,
    asr: ASRBackend,
    rows: Mapping[str, Mapping[str, Any]],
    elapsed_s: float,
    interrupted: bool,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    wer = summarize(rows, [item.utt for item in dataset.items])
    asr_times = [float(r["asr_s"]) for r in rows.values() if r.get("asr_s") is not None]
    failures = sorted(
        (
            {"utt": u, "status": r["status"], "error": r.get("error", "")}
            for u, r in rows.items()
            if r["status"] != STATUS_OK
        ),
        key=lambda f: f["utt"],
    )
    summary: dict[str, Any] = {
        "meta": str(dataset.meta_path),
        "locale": dataset.locale,
        "gen_dir": str(gen_dir),
        "asr": {"backend": asr.name, "model": asr.model_id, "device": asr.device},
        "meta_bad_lines": len(dataset.bad_lines),
        **wer.as_dict(),
        "headline_wer": wer.official.wer_mean,
        "asr_seconds_total": round(sum(asr_times), 3),
        "elapsed_s": round(elapsed_s, 3),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "interrupted": interrupted,
        "failures": failures[:50],
    }
    if extra:
        summary.update(extra)
    return summary


def per_utterance_wers(rows: Mapping[str, Mapping[str, Any]]) -> list[float]:
    return [float(r["wer"]) for r in rows.values() if r.get("status") == STATUS_OK and r.get("wer") is not None]


def write_histogram(rows: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> Path | None:
    """Histogram PNG of per-utterance WER (%); None (and a warning) when matplotlib is missing or no rows."""
    wers = [100.0 * w for w in per_utterance_wers(rows)]
    if not wers:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; skipping the WER histogram")
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(wers, bins=min(40, max(5, len(wers) // 3)), color="#4a7ab5")
    ax.axvline(statistics.fmean(wers), color="#c0392b", linestyle="--", label=f"mean {statistics.fmean(wers):.2f}%")
    ax.set_xlabel("per-utterance WER (%)")
    ax.set_ylabel("utterances")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def format_summary_table(summary: Mapping[str, Any]) -> str:
    """A terminal table of the two views and the counts."""

    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [
        f"Seed-TTS WER ({summary['locale']}, ASR {summary['asr']['backend']}: {summary['asr']['model']})",
        f"{'view':<22}{'n':>6}{'WER mean %':>12}{'median %':>10}{'corpus %':>10}",
    ]
    for key, label in (("official", "official-compatible"), ("strict", "strict")):
        v = summary[key]
        lines.append(
            f"{label:<22}{v['n']:>6}{fmt(v['wer_mean']):>12}{fmt(v['wer_median']):>10}{fmt(v['corpus_wer']):>10}"
        )
    c = summary["counts"]
    lines.append(
        "counts: "
        + ", ".join(f"{k}={c[k]}" for k in ("expected", "ok", "missing_audio", "unreadable_audio", "asr_failed"))
        + f", empty_transcription={c['empty_transcription']}, not_attempted={c['not_attempted']}"
    )
    if summary.get("meta_bad_lines"):
        lines.append(f"meta lines skipped as malformed: {summary['meta_bad_lines']}")
    req = summary.get("requests")
    if req:
        lines.append(
            "requests: "
            + ", ".join(f"{k}={v}" for k, v in req["counts"].items())
            + f"; TTFP mean {fmt(req['ttfp_s']['mean'])} s, p90 {fmt(req['ttfp_s']['p90'])} s"
            + f"; RTF mean {fmt(req['rtf']['mean'])}"
        )
    phases = f"ASR {summary['asr_seconds_total']:.1f} s"
    if summary.get("requests_elapsed_s") is not None:
        phases = f"requests {summary['requests_elapsed_s']:.1f} s, {phases}"
    lines.append(f"elapsed {summary['elapsed_s']:.1f} s ({phases})")
    return "\n".join(lines)
