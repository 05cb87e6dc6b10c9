# SPDX-License-Identifier: Apache-2.0
"""Environment variables read by vllm_omni_token2wav, in one place (like vLLM's `vllm.envs`).

| variable                                | meaning                                          | default               |
|-----------------------------------------|--------------------------------------------------|-----------------------|
| `VLLM_OMNI_TOKEN2WAV_PLATFORM`          | force the platform: auto, cpu, cuda, npu         | auto                  |
| `VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL`     | level of the `vllm_omni_token2wav` loggers       | INFO                  |
| `VLLM_OMNI_TOKEN2WAV_CACHE_DIR`         | generated stand-in assets, TensorRT engines,     | `$XDG_CACHE_HOME/`    |
|                                         | file caches                                      | `vllm_omni_token2wav` |
| `VLLM_OMNI_TOKEN2WAV_*_BUCKETS`         | padded shape sets (see                           | per set               |
|                                         | `model_executor/buckets.py`)                     |                       |
| `VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS`     | capture/replay device graphs                     | 1                     |
|                                         | (`platforms/device_graphs`): 1/true/on, or       |                       |
|                                         | 0/false/off for eager everywhere                 |                       |
| `VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS_MAX` | graphs one capture helper keeps (LRU beyond it)  | 64                    |
| `VLLM_OMNI_TOKEN2WAV_STAGE_STATS`       | a JSON file the Token2Wav stage model rewrites   | unset: no counters    |
|                                         | after every forward call with its cumulative     |                       |
|                                         | counters (engine tests read the worker's         |                       |
|                                         | batching and errors there; `stats.py` of         |                       |
|                                         | `model_executor/models/token2wav_stage/`);       |                       |
|                                         | `{replica}` in it: the replica id (one file per  |                       |
|                                         | replica of a stage with `num_replicas` > 1); the |                       |
|                                         | scheduler writes the latency planner's counters  |                       |
|                                         | to `<path>.planner.json` (`planner_stats.py`)    |                       |
| `VLLM_OMNI_TOKEN2WAV_STAGE_STATS_`      | seconds between two writes of that file by       | 0: every call         |
| `INTERVAL_S`                            | `forward` (`on_requests_finished` always writes; |                       |
|                                         | benchmarks: under CPU contention a write per     |                       |
|                                         | step costs the step whole scheduler slices)      |                       |
| `VLLM_OMNI_TOKEN2WAV_EXTRA_FAMILIES`    | out-of-tree Token2Wav families: a comma list of  | unset: the shipped    |
|                                         | modules defining `FAMILY` (appended to           | families only         |
|                                         | `families.FAMILY_MODULES`; tests' toy family)    |                       |
| `STEP_AUDIO2_DEFAULT_PROMPT_WAV`        | Step-Audio2 stage's default voice file           | model folder's        |
|                                         | (upstream's name; `families.py` of               | `default_female.wav`  |
|                                         | `model_executor/models/token2wav_stage/`)        |                       |

Values are read on every call (not frozen at import) so tests and long-lived processes see changes.
"""

from __future__ import annotations

import os
from pathlib import Path

DEVICE_GRAPHS_ENV = "VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS"
DEVICE_GRAPHS_MAX_ENV = "VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS_MAX"
STAGE_STATS_ENV = "VLLM_OMNI_TOKEN2WAV_STAGE_STATS"
STAGE_STATS_INTERVAL_ENV = "VLLM_OMNI_TOKEN2WAV_STAGE_STATS_INTERVAL_S"
EXTRA_FAMILIES_ENV = "VLLM_OMNI_TOKEN2WAV_EXTRA_FAMILIES"
#: vLLM-Omni's own variable (set by its engine-core process per replica of a stage); read, never set, here.
REPLICA_ID_ENV = "VLLM_OMNI_REPLICA_ID"
#: In `VLLM_OMNI_TOKEN2WAV_STAGE_STATS`: replaced by the replica id, one file per replica.
REPLICA_PLACEHOLDER = "{replica}"
DEFAULT_DEVICE_GRAPHS_MAX = 64
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def cache_dir(*parts: str) -> Path:
    """The project's file cache (created on demand), optionally a subfolder of it."""
    base = os.environ.get("VLLM_OMNI_TOKEN2WAV_CACHE_DIR")
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "vllm_omni_token2wav"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def device_graphs_enabled() -> bool:
    """`VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS` (default on); raises ValueError naming the variable for other values."""
    text = os.environ.get(DEVICE_GRAPHS_ENV, "1").strip().lower() or "1"
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{DEVICE_GRAPHS_ENV}={text!r}: expected one of {', '.join(_TRUE + _FALSE)}")


def device_graphs_max() -> int:
    """`VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS_MAX` (default 64): graphs one capture helper keeps before evicting."""
    text = os.environ.get(DEVICE_GRAPHS_MAX_ENV, "").strip()
    if not text:
        return DEFAULT_DEVICE_GRAPHS_MAX
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{DEVICE_GRAPHS_MAX_ENV}={text!r}: expected a positive integer (graphs per helper)")
    return value


def stage_stats_path() -> str | None:
    """`VLLM_OMNI_TOKEN2WAV_STAGE_STATS`: where the stage model writes its counters; None when unset or empty.

    A `{replica}` in the value becomes this process's vLLM-Omni replica id (`VLLM_OMNI_REPLICA_ID`, which the
    engine sets in each replica's engine-core process; 0 when unset), so the replicas of a stage with
    `num_replicas: N` each write their own file instead of overwriting one another's.
    """
    path = os.environ.get(STAGE_STATS_ENV) or None
    if path is None or REPLICA_PLACEHOLDER not in path:
        return path
    return path.replace(REPLICA_PLACEHOLDER, str(replica_id()))


def replica_id() -> int:
    """vLLM-Omni's `VLLM_OMNI_REPLICA_ID` of this process (the engine's own variable): 0 when unset or malformed."""
    try:
        return max(int(os.environ.get(REPLICA_ID_ENV, "0")), 0)
    except ValueError:
        return 0


def stage_stats_interval_s() -> float:
    """`VLLM_OMNI_TOKEN2WAV_STAGE_STATS_INTERVAL_S`: least seconds between two `forward` writes (0: every call)."""
    text = os.environ.get(STAGE_STATS_INTERVAL_ENV, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{STAGE_STATS_INTERVAL_ENV}={text!r}: expected seconds >= 0")
    return value


def extra_family_modules() -> tuple[str, ...]:
    """`VLLM_OMNI_TOKEN2WAV_EXTRA_FAMILIES`: the modules (each defining `FAMILY`) of out-of-tree families."""
    text = os.environ.get(EXTRA_FAMILIES_ENV, "")
    return tuple(name.strip() for name in text.split(",") if name.strip())
