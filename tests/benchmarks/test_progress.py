# SPDX-License-Identifier: Apache-2.0
"""Benchmark progress: plain lines (no carriage returns) off a terminal, a bar on one."""

from __future__ import annotations

import io

import pytest

from vllm_omni_token2wav.benchmarks.progress import BarProgress, LineProgress, NoProgress, progress

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_stream_gets_plain_lines_without_carriage_returns() -> None:
    out = io.StringIO()
    with progress(total=4, desc="requests", unit="req", stream=out, interval_s=0.0) as bar:
        assert isinstance(bar, LineProgress)
        for _ in range(4):
            bar.update()
        bar.write("table")
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("requests: 1/4 req (25 %") and "table" in lines
    assert lines[-1].startswith("requests: 4/4 req (100 %")


def test_interval_limits_the_number_of_lines() -> None:
    out = io.StringIO()
    with progress(total=1000, desc="x", stream=out, interval_s=3600.0) as bar:
        for _ in range(1000):
            bar.update()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]]  # only the final line


def test_terminal_gets_a_bar_and_disabled_reports_nothing() -> None:
    tty = _Tty()
    bar = progress(total=2, desc="t", stream=tty)
    assert isinstance(bar, BarProgress)
    bar.update(2)
    bar.write("after")
    bar.close()
    assert "after" in tty.getvalue()
    quiet = io.StringIO()
    with progress(total=2, desc="q", stream=quiet, enabled=False) as bar:
        assert isinstance(bar, NoProgress)
        bar.update()
    assert quiet.getvalue() == ""
