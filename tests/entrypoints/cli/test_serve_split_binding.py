# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav serve` in a split deployment on a CPU host unpins vLLM's CPU workers (`nobind`).

vLLM's `VLLM_CPU_OMP_THREADS_BIND=auto` pins every engine process's worker to the same core; in a split
deployment on one host the code2wav node's spinning worker starved the head's producer worker on that core
(docs/design/multinode.md). The wrapper sets `nobind` only for `--stage-id` runs without an accelerator and
without the user's own value.
"""

from __future__ import annotations

import pytest

from vllm_omni_token2wav.entrypoints.cli.serve import OMP_BIND_ENV, split_cpu_binding

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

HEAD = ["M", "--deploy-config", "x.yaml", "--stage-id", "0", "-oma", "127.0.0.1", "-omp", "29761"]
NODE = ["M", "--deploy-config", "x.yaml", "--stage-id=1", "--headless", "-oma", "127.0.0.1", "-omp", "29761"]


@pytest.mark.parametrize("args", [HEAD, NODE])
def test_split_processes_on_a_cpu_host_are_unpinned(args: list[str]) -> None:
    assert split_cpu_binding(args, {}, accelerator=False) == "nobind"


def test_one_engine_an_accelerator_or_the_users_value_are_left_alone() -> None:
    assert split_cpu_binding(["M", "--deploy-config", "x.yaml"], {}, accelerator=False) is None
    assert split_cpu_binding(HEAD, {}, accelerator=True) is None
    assert split_cpu_binding(NODE, {OMP_BIND_ENV: "0"}, accelerator=False) is None
