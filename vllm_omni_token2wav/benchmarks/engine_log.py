# SPDX-License-Identifier: Apache-2.0
"""Facts a served benchmark reads from a `vllm-omni-token2wav serve` log: per-request stage timings, CPU binding.

The producer stage runs inside the engine, out of the client's sight, yet its token rate decides
how fast codes reach code2wav (the emulated benchmark's `talker_rate`). vLLM-Omni 0.30's API server
logs one table per finished request (`[StageRequestStats [request_id=...]]`, `vllm_omni/entrypoints/.../stats.py`)
with a column per stage: `num_tokens_out`, `vllm_ttft_ms`, `vllm_tpot_ms`, `stage_gen_time_ms`, ...
`stage_request_stats` parses those tables from a slice of the log (ANSI colours and thousands
separators removed); a talker's own rate is then `1000 / vllm_tpot_ms` codes per second.

vLLM's CPU executor logs how it binds each stage's OpenMP threads (`ompmultiprocessing.py`: "core
ids=[...]", "reserved_cpus=[...]", per engine-core process); `cpu_binding` returns that per stage.
On a 2-core host its `auto` binding puts every stage's worker on core 0 and reserves core 1 for the
API server and engine cores, which a reader of the figures must know.

Parsing a log is best effort: a table or line of another shape is skipped, never an error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TABLE_START = re.compile(r"\[StageRequestStats \[request_id=(?P<rid>[^\]\s]+)\]\]")
_ROW = re.compile(r"\|\s*(?P<field>[A-Za-z_0-9]+)\s*\|(?P<cells>(?:[^|]*\|)+)\s*$")
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
_STAGE_PROC = re.compile(r"StageEngineCoreProc_stage(?P<stage>[0-9]+)")
_CORE_IDS = re.compile(r"local_rank=(?P<rank>[0-9]+), core ids=\[(?P<ids>[0-9, ]*)\]")
_RESERVED = re.compile(r"reserved_cpus=\[(?P<ids>[0-9, ]*)\]")


def read_from(path: Path, offset: int) -> tuple[str, int]:
    """The log text from byte `offset` on, and the offset of its end (the next slice starts there)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return "", offset
    return data.decode(errors="replace"), offset + len(data)


def _clean(line: str) -> str:
    return _ANSI.sub("", line).replace("\r", "")


def _number(cell: str) -> float | None:
    match = _NUMBER.search(cell)
    return None if match is None else float(match.group().replace(",", ""))


def stage_request_stats(text: str) -> list[dict[str, Any]]:
    """Every per-request stage table in `text`: `{"request_id": ..., "stages": [{field: number}, ...]}`."""
    tables: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = _clean(raw)
        start = _TABLE_START.search(line)
        if start is not None:
            current = {"request_id": start.group("rid"), "stages": []}
            tables.append(current)
            continue
        if current is None:
            continue
        row = _ROW.search(line)
        if row is None:
            if "+---" not in line:
                current = None  # the table ended (or another record interrupted it)
            continue
        cells = row.group("cells").split("|")[:-1]
        if row.group("field") == "Field":
            continue
        while len(current["stages"]) < len(cells):
            current["stages"].append({})
        for stage, cell in zip(current["stages"], cells, strict=False):
            value = _number(cell)
            if value is not None:
                stage[row.group("field")] = value
    return [t for t in tables if t["stages"]]


def talker_codes_per_s(tables: list[dict[str, Any]], stage: int = 0) -> list[float]:
    """The producer's own decode rate of each request, `1000 / vllm_tpot_ms` of `stage` (codes per second)."""
    rates = []
    for table in tables:
        stages = table["stages"]
        tpot = stages[stage].get("vllm_tpot_ms") if stage < len(stages) else None
        if tpot:
            rates.append(1000.0 / tpot)
    return rates


def cpu_binding(text: str) -> dict[str, Any]:
    """`{"stage_<n>": [core ids], "reserved": [ids]}` from vLLM's OpenMP binding lines (empty if none)."""
    out: dict[str, Any] = {}
    for raw in text.splitlines():
        line = _clean(raw)
        proc = _STAGE_PROC.search(line)
        cores = _CORE_IDS.search(line)
        if proc is not None and cores is not None:
            out[f"stage_{proc.group('stage')}"] = [int(x) for x in cores.group("ids").replace(" ", "").split(",") if x]
        reserved = _RESERVED.search(line)
        if reserved is not None:
            out["reserved"] = [int(x) for x in reserved.group("ids").replace(" ", "").split(",") if x]
    return out


__all__ = ["cpu_binding", "read_from", "stage_request_stats", "talker_codes_per_s"]
