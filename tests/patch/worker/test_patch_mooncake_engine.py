# SPDX-License-Identifier: Apache-2.0
"""The code2wav edge on Mooncake's transfer engine (TCP, loopback) in one engine, driven by the real vLLM-Omni.

The stand-in Step-Audio2 stream pipeline (`standin_step_audio2_stream.yaml`, as `test_stream.py` runs it) with
its stage-0 -> stage-1 edge moved from SharedMemory to vLLM-Omni's `MooncakeTransferEngineConnector` over TCP on
127.0.0.1 (the `multinode` extra; README, "Running the code2wav stage on its own node"). The engine starts only
with the plugin's two Mooncake patches (`patch/worker/patch_async_chunk_sender.py`: one sender per async-chunk
edge; `patch/worker/patch_mooncake_connectors.py`: the connectors' `stage_id`, and `memory_pool_device: cpu`, the
default left in place here, as `cpu:0` on a host without an accelerator).

Checks: concurrent streamed requests each equal the same chunks (cut by upstream's own async-chunk function)
streamed through our stage alone in this process (<= 1e-6), complete (960 samples per code); the stage saw
exactly those chunks; every chunk crossed Mooncake (the edge benchmark's recorder,
`vllm_omni_token2wav/benchmarks/token2wav_serve/transfer_site/sitecustomize.py`, logs each connector put / get in
the engine processes: one Mooncake put in stage 0's process and one get in stage 1's per chunk, keyed by the
request); a request whose prompt exceeds the
producer's 4096 positions fails alone. Outside `tests/e2e/` (whose conftest puts this checkout on the engine
processes' `PYTHONPATH`), the fixture does that itself.

Needs `mooncake-transfer-engine-non-cuda` and its system libraries (`tools/dev_setup.sh` installs both; in CI
the module fails instead of skipping when they are missing).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, SAMPLES_PER_TOKEN, OfflineEngine
from tests.e2e.references import max_abs, new_tokens, reference_stage, streamed_request, upstream_chunks
from tests.helpers.engine import in_ci, require_engine, require_mooncake
from vllm_omni_token2wav.benchmarks.token2wav_serve import transfer_site
from vllm_omni_token2wav.benchmarks.token2wav_serve.edges import mooncake_connector
from vllm_omni_token2wav.benchmarks.token2wav_serve.transfer_site.sitecustomize import ENV as TRANSFERS_ENV
from vllm_omni_token2wav.deploy import deploy_config
from vllm_omni_token2wav.model_executor.models.standin.toy import write_overlay

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the Mooncake edge engine tests")
require_mooncake("the Mooncake edge engine tests")

FAMILY = "step_audio2"
TOLERANCE = 1e-6
#: Codes per request: chunk-boundary ends (75, 100) and remainders; 2 to 4 chunks each.
LENGTHS = (53, 75, 100, 61)
REPO_ROOT = Path(__file__).resolve().parents[3]
SITE = Path(transfer_site.__file__).parent  # its sitecustomize times every connector put / get
RECORD_ENV = TRANSFERS_ENV
MOONCAKE = "MooncakeTransferEngineConnector"
MAX_MODEL_LEN = 4096  # the stand-in producer's (standin_step_audio2_stream.yaml)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_mooncake_imports() -> None:
    from vllm_omni_token2wav.patch import mooncake_libs

    mooncake_libs.preload()
    try:
        import mooncake.engine  # noqa: F401
    except ImportError as exc:
        message = (
            f"mooncake.engine does not import ({exc}): install {' '.join(mooncake_libs.DEBIAN_PACKAGES)} or run "
            f"`bash tools/fetch_multinode_libs.sh DEST` and set {mooncake_libs.ENV}=DEST (tools/dev_setup.sh does)"
        )
        if in_ci():
            raise RuntimeError(message) from exc
        pytest.skip(message)


@pytest.fixture(scope="module")
def mooncake_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OfflineEngine, Path]]:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    _check_mooncake_imports()
    tmp = tmp_path_factory.mktemp("mooncake_edge")
    records = tmp / "transfers"
    records.mkdir()
    deploy = write_overlay(
        tmp / f"standin_{FAMILY}_stream.yaml",
        deploy_config(f"standin_{FAMILY}_stream"),
        {
            0: {"output_connectors": {"to_stage_1": "connector_of_mooncake"}},
            1: {"additional_config": FAST_STAGE_OPTIONS, "input_connectors": {"from_stage_0": "connector_of_mooncake"}},
        },
        top={"connectors": mooncake_connector(_free_port())},
    )
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", RECORD_ENV)}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), str(REPO_ROOT), saved["PYTHONPATH"]) if p)
    os.environ[RECORD_ENV] = str(records)
    try:
        engine = OfflineEngine(ensure_engine_model_dir(FAMILY), deploy, tmp / "stage_stats.json")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        yield engine, records
    finally:
        engine.close()


def transfers(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """The recorder's Mooncake lines per engine process (pid)."""
    return {
        int(p.stem): [r for r in map(json.loads, p.read_text().splitlines()) if r["connector"] == MOONCAKE]
        for p in folder.glob("*.jsonl")
    }


def _sampling(max_tokens: int) -> list[Any]:
    from vllm import SamplingParams

    producer = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    return [producer, SamplingParams(max_tokens=1, detokenize=False)]


def test_streams_over_the_mooncake_edge_equal_the_stage_alone_and_a_bad_request_fails_alone(
    mooncake_engine: tuple[OfflineEngine, Path],
) -> None:
    engine, records = mooncake_engine
    prompts = {f"mc{i}": [43 + 3 * i, 51 + i, 62 + 2 * i, 70, 83 + i] for i in range(len(LENGTHS))}
    counts = dict(zip(prompts, LENGTHS, strict=True))
    requests = {rid: ({"prompt_token_ids": prompt}, _sampling(counts[rid])) for rid, prompt in prompts.items()}
    requests["mcbad"] = ({"prompt_token_ids": [7] * (MAX_MODEL_LEN + 10)}, _sampling(50))

    outcomes = engine.run(requests)

    bad = outcomes["mcbad"]
    assert bad.error is not None and not bad.audio, "a prompt beyond the producer's 4096 positions must fail"
    counters = engine.counters()
    assert counters["errors"] == 0 and counters["live_streams"] == 0, counters.raw
    reference = reference_stage(FAMILY, engine.model, async_chunk=True)
    every = transfers(records)
    for rid, prompt in prompts.items():
        final = outcomes[rid].final
        assert outcomes[rid].sample_rate == 24000
        assert final.shape == (SAMPLES_PER_TOKEN * counts[rid],), rid
        chunks = upstream_chunks(FAMILY, rid, prompt, counts[rid])
        assert counters.chunks(rid) == [(new_tokens(c), c.last) for c in chunks], rid
        assert max_abs(final, streamed_request(reference, chunks, counters.seed(rid))) <= TOLERANCE, rid
        # each chunk crossed Mooncake: put by one process (stage 0), got by another (stage 1), once per chunk
        by_op = {
            op: {pid for pid, lines in every.items() for line in lines if line["op"] == op and rid in line["key"]}
            for op in ("put", "get")
        }
        puts = [line for lines in every.values() for line in lines if line["op"] == "put" and rid in line["key"]]
        gets = [line for lines in every.values() for line in lines if line["op"] == "get" and rid in line["key"]]
        assert len(by_op["put"]) == 1 and len(by_op["get"]) == 1 and by_op["put"] != by_op["get"], (rid, by_op)
        assert len(puts) == len(chunks) and all(p["ok"] for p in puts), (rid, len(chunks), puts)
        assert len(gets) == len(chunks), (rid, len(chunks), gets)
    times = {
        op: sorted(line["ms"] for lines in every.values() for line in lines if line["op"] == op)
        for op in ("put", "get")
    }
    print(  # the per-chunk transfer times (pytest -s), for the docs
        "mooncake edge per chunk: "
        + ", ".join(f"{op} p50 {t[len(t) // 2]:.2f} ms max {t[-1]:.2f} ms (n={len(t)})" for op, t in times.items())
    )
