# SPDX-License-Identifier: Apache-2.0
"""Read Seed-TTS evaluation meta files (`meta.lst`) into typed items.

The public Seed-TTS test sets describe one utterance per line as
`utt|prompt_text|prompt_wav|target_text` with an optional fifth field (a ground-truth wav); wav paths are
relative to the folder holding the meta file. The official scripts split lines without checking them, so a
stray `|` or a truncated line silently shifts fields; this reader rejects such lines with the file and line
number (or, with `skip_bad_lines=True`, skips and counts them so a report can show how many were dropped).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

LOCALES = ("en", "zh")


class MetaFormatError(ValueError):
    """A meta file (or one of its lines) does not follow `utt|prompt_text|prompt_wav|target_text[|gt_wav]`."""


@dataclass(frozen=True)
class SeedTTSItem:
    """One utterance of a Seed-TTS meta file; paths are absolute."""

    utt: str
    prompt_text: str
    prompt_wav: Path
    target_text: str
    gt_wav: Path | None = None
    line_no: int = 0


@dataclass(frozen=True)
class BadLine:
    """A meta line that was skipped (`skip_bad_lines=True`), with why."""

    line_no: int
    reason: str


@dataclass
class SeedTTSDataset:
    """The items of one meta file, in file order unless shuffled."""

    meta_path: Path
    locale: str
    items: list[SeedTTSItem]
    bad_lines: list[BadLine] = field(default_factory=list)
    total_lines: int = 0

    def __len__(self) -> int:
        return len(self.items)

    def by_utt(self) -> dict[str, SeedTTSItem]:
        return {item.utt: item for item in self.items}

    def missing_prompt_wavs(self) -> list[SeedTTSItem]:
        """Items whose prompt wav does not exist (serve mode needs every prompt)."""
        return [item for item in self.items if not item.prompt_wav.is_file()]


def _parse_line(line: str, line_no: int, base: Path) -> SeedTTSItem:
    fields = line.split("|")
    if len(fields) not in (4, 5):
        raise MetaFormatError(
            f"expected 4 or 5 '|'-separated fields (utt|prompt_text|prompt_wav|target_text[|gt_wav]), got {len(fields)}"
        )
    utt, prompt_text, prompt_wav, target_text = (f.strip() for f in fields[:4])
    if not utt:
        raise MetaFormatError("empty utterance id (field 1)")
    if "/" in utt or "\\" in utt or utt in (".", ".."):
        raise MetaFormatError(f"utterance id {utt!r} contains a path separator; it names the output '<utt>.wav'")
    if not prompt_wav:
        raise MetaFormatError("empty prompt wav path (field 3)")
    if not target_text:
        raise MetaFormatError("empty target text (field 4)")
    gt_wav = None
    if len(fields) == 5 and fields[4].strip():
        gt_wav = (base / fields[4].strip()).resolve()
    return SeedTTSItem(
        utt=utt,
        prompt_text=prompt_text,
        prompt_wav=(base / prompt_wav).resolve(),
        target_text=target_text,
        gt_wav=gt_wav,
        line_no=line_no,
    )


def load_seed_tts_meta(
    meta_path: str | Path,
    locale: str = "en",
    *,
    subset: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    skip_bad_lines: bool = False,
    require_prompt_wavs: bool = False,
) -> SeedTTSDataset:
    """Read a Seed-TTS `meta.lst`.

    Blank lines and lines starting with `#` are ignored. Duplicate utterance ids are an error (they would
    overwrite each other's `<utt>.wav`). `shuffle` permutes with `random.Random(seed)` before `subset` takes the
    first N items, so a subset is reproducible from (seed, N). `require_prompt_wavs` checks that every prompt
    wav exists (needed to drive a server; scoring generated audio does not read prompts).
    """
    path = Path(meta_path)
    if locale not in LOCALES:
        raise ValueError(f"locale must be one of {LOCALES}, got {locale!r}")
    if subset is not None and subset < 1:
        raise ValueError(f"subset must be >= 1, got {subset}")
    if not path.is_file():
        raise FileNotFoundError(f"Seed-TTS meta file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MetaFormatError(f"{path}: not UTF-8 text ({exc}); is this really a meta.lst?") from exc

    base = path.resolve().parent
    items: list[SeedTTSItem] = []
    bad: list[BadLine] = []
    seen: dict[str, int] = {}
    total = 0
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip("\r\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        total += 1
        try:
            item = _parse_line(line, line_no, base)
            if item.utt in seen:
                raise MetaFormatError(f"duplicate utterance id {item.utt!r} (first on line {seen[item.utt]})")
        except MetaFormatError as exc:
            if not skip_bad_lines:
                raise MetaFormatError(f"{path}:{line_no}: {exc}") from None
            bad.append(BadLine(line_no, str(exc)))
            continue
        seen[item.utt] = line_no
        items.append(item)

    if bad:
        first_bad = bad[0]
        logger.warning(
            "%s: skipped %d malformed line(s) of %d (first: line %d: %s)",
            path,
            len(bad),
            total,
            first_bad.line_no,
            first_bad.reason,
        )
    if not items:
        raise MetaFormatError(f"{path}: no usable utterances ({total} non-comment lines, {len(bad)} malformed)")
    if shuffle:
        random.Random(seed).shuffle(items)
    if subset is not None:
        items = items[:subset]
    dataset = SeedTTSDataset(meta_path=path, locale=locale, items=items, bad_lines=bad, total_lines=total)
    if require_prompt_wavs:
        missing = dataset.missing_prompt_wavs()
        if missing:
            first = missing[0]
            raise FileNotFoundError(
                f"{path}: {len(missing)} prompt wav(s) missing, first {first.prompt_wav} (line {first.line_no}, "
                f"utt {first.utt}); prompt paths are resolved relative to the meta file's folder"
            )
    return dataset
