# SPDX-License-Identifier: Apache-2.0
"""The cross-host edge the multi-node engine tests configure: Mooncake's transfer engine over TCP on loopback.

`mooncake_edge(port)` is the deploy YAML's top-level `connectors:` entry (`connector_of_mooncake`) that
`tests/patch/worker/test_patch_mooncake_engine.py` (one engine) and
`tests/entrypoints/cli/test_serve_split_node.py` (head + headless code2wav node) put on the stand-in
stream pipeline's stage-0 -> stage-1 edge; the README's "Running the code2wav stage on its own node" shows the same
keys. `memory_pool_device` is left at upstream's default (`cpu`): the plugin's patch makes it `cpu:0` on a host
without an accelerator. The chunk keys (`codec_chunk_frames`, `codec_left_context_frames`) and polling waits are
the shipped SharedMemory edge's.
"""

from __future__ import annotations

from typing import Any


def mooncake_edge(zmq_port: int) -> dict[str, Any]:
    """The `connectors:` entry of the edge: Mooncake TE over TCP on loopback, the stream's chunk keys kept."""
    return {
        "connector_of_mooncake": {
            "name": "MooncakeTransferEngineConnector",
            "extra": {
                "host": "127.0.0.1",
                "protocol": "tcp",
                "zmq_port": zmq_port,
                "memory_pool_size": 64 * 1024 * 1024,
                "connector_get_sleep_s": 0.01,
                "connector_get_max_wait_first_chunk": 3000,
                "connector_get_max_wait": 300,
                "codec_chunk_frames": 25,
                "codec_left_context_frames": 3,
            },
        }
    }


__all__ = ["mooncake_edge"]
