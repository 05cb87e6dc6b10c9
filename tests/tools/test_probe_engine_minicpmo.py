# SPDX-License-Identifier: Apache-2.0
"""tools/probe_engine_minicpmo.py without an engine: what a request carries and how a wave is counted.

Upstream's MiniCPM-o code2wav refuses a request without producer metadata, so every probe request must carry
`request_id`, `chunk_seq` 0 and `last_chunk` true; a request counts as served only with its full audio; the
table names both arms and their fault waves. (The engine run itself is recorded under benchmarks/results/.)
"""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.helpers.recorder import REPO, load_script

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    return load_script(REPO / "tools" / "probe_engine_minicpmo.py", "probe_engine_minicpmo")


def test_every_request_carries_the_producer_metadata_upstream_requires(probe: ModuleType) -> None:
    assert probe._metadata("c4-1") == {"request_id": ["c4-1"], "chunk_seq": [0], "last_chunk": [True]}


def test_a_wave_counts_only_full_replies(probe: ModuleType) -> None:
    full = 50 * probe.SAMPLES_PER_TOKEN
    wave = [
        {"id": "a", "arrival_s": 0.0, "end_s": 2.0, "samples": full},
        {"id": "b", "arrival_s": 0.0, "end_s": 4.0, "samples": full},
        {"id": "c", "arrival_s": 1.0, "end_s": 3.0, "samples": full - 960},  # short: not served
        {"id": "d", "arrival_s": 1.0, "end_s": 1.5, "samples": 0, "error": "OmniEngineDeadError: dead"},
    ]
    level = probe._level(wave, 50)
    assert (level["requests"], level["failed"], level["first_error"]) == (4, 2, "OmniEngineDeadError: dead")
    assert level["audio_s"] == pytest.approx(4.0) and level["makespan_s"] == pytest.approx(4.0)
    assert level["throughput_audio_s_per_s"] == pytest.approx(1.0)
    assert (level["latency_p50_s"], level["latency_max_s"]) == (3.0, 4.0)


def test_the_table_names_both_arms_and_their_fault_waves(probe: ModuleType) -> None:
    level = {"requests": 2, "failed": 0, "throughput_audio_s_per_s": 1.25, "latency_p50_s": 1.5, "latency_max_s": 1.6}
    results = {
        "command": "python tools/probe_engine_minicpmo.py",
        "seconds": 2.0,
        "arms": {
            "upstream": {
                "max_num_seqs": 4,
                "max_num_seqs_source": "vllm_omni/deploy/minicpmo_4_5.yaml stage 2",
                "levels": {"1": level},
                "fault": {"got_audio": 0, "bad_error": "OmniEngineDeadError: dead", "next_request_ok": False},
                "load_start": [1.0, 1.0, 1.0],
                "peak_rss_bytes": 5 << 30,
            },
            "ours": {"max_num_seqs": 8, "levels": {"1": level}, "error": "exit code 1, no result"},
        },
    }
    text = probe.render(results)
    assert "| upstream | 4 | 1 | 2 | 0 | 1.25 | 1.50 | 1.60 |" in text
    assert "| ours | 8 | 1 | 2 | 0 | 1.25 | 1.50 | 1.60 |" in text
    assert "upstream: max_num_seqs from vllm_omni/deploy/minicpmo_4_5.yaml stage 2" in text
    assert "peak RSS 5120 MiB; fault wave 0/8 got audio, bad request: OmniEngineDeadError: dead" in text
    assert "error: exit code 1, no result" in text
