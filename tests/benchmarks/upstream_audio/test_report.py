# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.upstream_audio`'s arithmetic and rendering, without the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.upstream_audio import report
from benchmarks.upstream_audio.run import (
    Agreement,
    UpstreamAudioConfig,
    UpstreamAudioReport,
    compare,
    compare_tokens,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_compare_gives_max_abs_and_relative_l2_over_the_common_length() -> None:
    upstream = torch.tensor([3.0, 4.0, 0.0, 9.0])
    ours = torch.tensor([3.0, 4.5, -1.0])
    row = compare("case", "audio", ours, upstream)
    assert (row.n_ours, row.n_upstream) == (3, 4) and not row.same_length
    assert row.max_abs == pytest.approx(1.0)
    assert row.rel_l2 == pytest.approx((0.25 + 1.0) ** 0.5 / 5.0)


def test_equal_tensors_agree_exactly_and_empty_ones_are_refused() -> None:
    x = torch.randn(2, 80, 7, generator=torch.Generator().manual_seed(0))
    row = compare("case", "mel", x, x.clone())
    assert row.max_abs == 0.0 and row.rel_l2 == 0.0 and row.same_length
    with pytest.raises(ValueError, match="case / mel: empty tensor"):
        compare("case", "mel", torch.empty(0), x)


def test_tokens_count_differing_positions_and_extra_length() -> None:
    row = compare_tokens("case", torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 5, 3]]))
    assert row.max_abs == 2.0  # one differing position + one token only ours has
    assert row.rel_l2 == pytest.approx(2 / 3)


def _report() -> UpstreamAudioReport:
    rows = [
        compare_tokens("prompt", torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, 4]), "backends"),
        Agreement("whole", "mel", 10, 10, 1.5e-6, 2.5e-7),
        Agreement("stream", "chunk 0 audio", 960, 980, 0.0, 0.0, "28 tokens"),
    ]
    return UpstreamAudioReport(
        config=UpstreamAudioConfig(model_dir=Path("/x")), model_dir="/x", rows=rows, command="cmd"
    )


def test_table_shows_every_row_with_token_counts_and_length_mismatches() -> None:
    text = report.render_text(_report())
    lines = text.splitlines()
    assert any("prompt tokens (differing)" in line and "1 of 4" in line and "25.0%" in line for line in lines)
    assert any("whole" in line and "1.50e-06" in line and "2.50e-07" in line for line in lines)
    assert any("chunk 0 audio" in line and "(lengths differ)" in line for line in lines)
    assert "command: cmd" in text


def test_json_holds_config_and_rows(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    report.write_json(_report(), path)
    data = json.loads(path.read_text())
    assert data["benchmark"] == "upstream_audio" and data["config"]["model_dir"] == "/x"
    assert [r["quantity"] for r in data["rows"]] == ["prompt tokens (differing)", "mel", "chunk 0 audio"]
    assert data["rows"][1]["max_abs"] == 1.5e-6


def test_home_and_recorder_are_registered() -> None:
    from benchmarks import DEV_BENCHMARKS, load_dev_recorders
    from vllm_omni_token2wav.entrypoints.cli.bench import load_bench_subcommands

    assert "upstream_audio" in DEV_BENCHMARKS
    assert "upstream-audio" not in {sub.name for sub in load_bench_subcommands()}  # not shipped
    recorder = load_dev_recorders()["upstream_audio"]
    assert (recorder.program, recorder.command) == ("python -m benchmarks.upstream_audio", ())
    _, stem = recorder.plan(["--threads", "2", "--device", "cpu"], Path("/r"))
    assert stem == Path("/r/upstream_audio_cpu")
