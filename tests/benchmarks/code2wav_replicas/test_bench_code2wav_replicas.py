# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.code2wav_replicas`: its options, and what it calls a whole reply (no engine started here).

The run itself starts two engines (minutes); `tests/e2e/test_replicas.py` covers two replicas end to end.
Here: usage errors exit 2 before any engine starts, and `judge` (the benchmark's verdict on each reply from
the replicas' counters) catches a short reply, a request served by both replicas and a missing last chunk.
"""

from __future__ import annotations

import pytest

from benchmarks.code2wav_replicas.run import SAMPLES_PER_CODE, Reply, judge
from tests.helpers.bench_cli import run_dev

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

CODES = 53


def _reply(samples: int = SAMPLES_PER_CODE * CODES, error: str | None = None) -> Reply:
    return Reply("rep0-3", 0.0, first_audio=0.5, done=1.0, samples=samples, outputs=3, error=error)


#: Replica 1 served request `rep0-3` (engine key `rep0-3-ab12`) as upstream's chunker cuts 53 codes: 25 + 3
#: lookahead, then the 28 from code 25 on (as `tests/e2e/test_replicas.py` saw them); `rep0-30` is another
#: request whose id starts with the same characters (its key must not be taken for `rep0-3`'s).
WHOLE = [
    {"chunks": {"rep0-30-ffff": [[28, False], [25, True]]}},
    {"chunks": {"rep0-3-ab12": [[28, False], [28, True]]}},
]


@pytest.mark.parametrize(
    "argv",
    [["--replicas", "0,2"], ["--replicas", "2,2"], ["--replicas", "two"], ["--requests", "0"], ["--codes", "0"]],
)
def test_bad_options_are_usage_errors_before_any_engine_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_dev(capsys, "code2wav_replicas", *argv)
    assert code == 2 and argv[0] in err


def test_a_whole_reply_is_owned_by_one_replica() -> None:
    assert judge(_reply(), WHOLE, CODES) == ([1], None)


@pytest.mark.parametrize(
    ("reply", "counters", "owners", "problem"),
    [
        (_reply(samples=SAMPLES_PER_CODE * 28), WHOLE, [1], "26880 samples, expected 50880"),
        (_reply(error="TimeoutError: hung"), WHOLE, [1], "TimeoutError: hung"),
        (  # its second chunk reached the other replica
            _reply(),
            [{"chunks": {"rep0-3-ab12": [[28, True]]}}, {"chunks": {"rep0-3-ab12": [[28, False]]}}],
            [0, 1],
            "served by replicas [0, 1], expected exactly one",
        ),
        (
            _reply(),
            [{}, {"chunks": {"rep0-3-ab12": [[28, False], [28, False]]}}],
            [1],
            "(ended: False)",
        ),
        (  # a chunk lost on the way: 28 codes short
            _reply(),
            [{}, {"chunks": {"rep0-3-ab12": [[28, True]]}}],
            [1],
            "served 28 codes of it",
        ),
        (_reply(), [{}, {}], [], "served by replicas [], expected exactly one"),
    ],
)
def test_a_reply_that_is_not_whole_is_named(
    reply: Reply, counters: list[dict], owners: list[int], problem: str
) -> None:
    got_owners, got_problem = judge(reply, counters, CODES)
    assert got_owners == owners and got_problem is not None and problem in got_problem
